"""API keys: with --api-key or --api-key-file every route (health checks included) but GET /
(bubo.api.about.PUBLIC_PATHS: it says only that bubo runs, without a key) needs `Authorization:
Bearer KEY` or `x-api-key: KEY`; otherwise 401 with WWW-Authenticate: Bearer.

A key file keeps llama-server's lines (one key per line, blank lines and # comments skipped) and
also takes `NAME KEY` lines: the key's caller has that name (bubo.api.callers: the request log,
/metrics, /slots, and whose stored responses, contexts and slot files are whose). A named key is at
least MIN_NAMED_KEY characters; a name or a key given twice is refused with the line numbers. The
file is read again on SIGHUP (reload()); a file that is wrong then leaves the keys as they were."""

from __future__ import annotations

import hmac
import logging
import re
from dataclasses import dataclass, field

from flask import request

from bubo.api.errors import ApiError

log = logging.getLogger("bubo.serve")

MIN_NAMED_KEY = 16
# a caller's name: safe in a log line, a Prometheus label and a folder name
CALLER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
MAX_KEY_FILE_BYTES = 1 << 20


class KeyFileError(ValueError):
    pass


@dataclass(frozen=True)
class Keys:
    """The keys a server takes: every key (--api-key's first, then the file's), and the caller's
    name of each named one."""

    keys: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)


def request_keys() -> list[str]:
    """The keys the request offers: the Bearer token and the x-api-key header (an SDK may send
    both, one of them a placeholder)."""
    keys = []
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        keys.append(value.strip())
    key = request.headers.get("x-api-key", "").strip()
    if key:
        keys.append(key)
    return keys


def matching_key(given: list[str], keys: list[str]) -> str | None:
    """The server's key that one of the given keys equals, or None. Every given key is compared
    with every key, each comparison in constant time (hmac.compare_digest): how long it takes says
    nothing of which key nearly matched, or where a wrong key first differs."""
    match: str | None = None
    for g in given:
        for k in keys:
            if hmac.compare_digest(g.encode(), k.encode()) and match is None:
                match = k
    return match


def check_api_key(keys: list[str]) -> str | None:
    """401 unless the request offers one of keys (none: every request passes); the key it offered."""
    if not keys or request.method == "OPTIONS":  # a CORS preflight carries no credentials
        return None
    given = request_keys()
    match = matching_key(given, keys)
    if match is None:
        why = "no API key given" if not given else "the API key is not valid"
        raise ApiError(401, "invalid_api_key",
                       f"{why}: send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                       headers={"WWW-Authenticate": "Bearer"})
    return match


def load_key_file(path: str) -> list[str]:
    """The file's keys, named or not (read_key_file)."""
    return [key for _, _, key in read_key_file(path)]


def read_key_file(path: str) -> list[tuple[int, str | None, str]]:
    """(line number, caller's name or None, key) for each key line; KeyFileError names the line of
    what is wrong (a name that is not a plain name, a named key that is short, a name or a key
    given twice)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise KeyFileError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{path} is larger than {MAX_KEY_FILE_BYTES} bytes: is it a key file?")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark an editor wrote is no part of the first key
    except UnicodeDecodeError as e:
        raise KeyFileError(f"{path} is not UTF-8 text (byte {e.start})") from None
    out: list[tuple[int, str | None, str]] = []
    names: dict[str, int] = {}
    keys: dict[str, int] = {}
    for n, line in enumerate(text.split("\n"), 1):  # lines as an editor numbers them (CRLF too)
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if len(words) > 2:
            raise KeyFileError(f"{path}, line {n}: give a key, or a caller's name and a key (NAME KEY); "
                               f"this line has {len(words)} words")
        name, key = (None, words[0]) if len(words) == 1 else (words[0], words[1])
        if name is not None:
            if not CALLER_NAME.fullmatch(name):
                raise KeyFileError(f"{path}, line {n}: the caller's name {name[:80]!r} must be letters, digits and "
                                   "_.@+- (at most 64, starting with a letter or digit)")
            if len(key) < MIN_NAMED_KEY:
                raise KeyFileError(f"{path}, line {n}: the key of {name} has {len(key)} characters; a named key "
                                   f"needs at least {MIN_NAMED_KEY}")
            if name.lower() in names:  # Alice and alice: one folder of slot files on some filesystems
                raise KeyFileError(f"{path}, line {n}: the caller {name} is named on line {names[name.lower()]} "
                                   "already (names differing only in letter case are one name)")
            names[name.lower()] = n
        if key in keys:
            raise KeyFileError(f"{path}, line {n}: the same key is on line {keys[key]} already")
        keys[key] = n
        out.append((n, name, key))
    return out


def load_keys(given: list[str], path: str | None) -> Keys:
    """--api-key's keys (unnamed callers) and --api-key-file's; KeyFileError for a file that is
    wrong, or for a key of the file that --api-key gives too."""
    lines = read_key_file(path) if path else []
    if path and not lines and not given:
        raise KeyFileError(f"{path} holds no key: every request would be let in (comment lines and blank "
                           "lines are no keys)")
    keys = list(given)
    names: dict[str, str] = {}
    for n, name, key in lines:
        if key in given:
            raise KeyFileError(f"{path}, line {n}: that key is given with --api-key too")
        keys.append(key)
        if name is not None:
            names[key] = name
    return Keys(keys, names)


def reload(current: Keys, given: list[str], path: str) -> Keys:
    """SIGHUP: the key file read again; a file that cannot be used keeps the current keys (and
    the log says why)."""
    try:
        keys = load_keys(given, path)
    except KeyFileError as e:
        log.error("the API keys were not reloaded (the old ones stay in force): %s", e)
        return current
    log.info("the API keys were reloaded from %s: %d keys, %d named", path, len(keys.keys), len(keys.names))
    return keys


# --- the Host header -----------------------------------------------------------------------
#
# A web page can make the browser send requests here by giving its own host name an address of
# this machine (DNS rebinding): the page's origin then equals the Host it sends, so the Origin
# check passes, and without an API key every route is open to it. Its requests carry the page's
# host name. So a request is answered only under a name the server answers to: its bind address,
# a loopback name (localhost, *.localhost, 127.0.0.1, [::1]), any IP address (a page cannot be
# rebound to a name that is an address), the names of --host-allow (".example.com": it and every
# name under it; "*": any); or any name at all when the server has an API key (such a page cannot
# send the key: every route but the public ones refuses it, and those show nothing a key guards).


def host_name(host: str) -> str:
    """The name in a Host header: without its port and IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str | None, bind: str, allow: list[str], keyed: bool) -> bool:
    """Whether a request whose Host header is host may be answered (see above)."""
    import ipaddress

    if host is None or not host.strip() or keyed:
        return True  # no Host at all: no browser sends that (HTTP/1.0 tools do)
    name = host_name(host).rstrip(".")
    if name in ("localhost", host_name(bind)) or name.endswith(".localhost"):
        return True
    for a in allow:
        a = a.strip().lower().rstrip(".")
        if a == "*" or name == host_name(a) or (a.startswith(".") and (name == a[1:] or name.endswith(a))):
            return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host(bind: str, allow: list[str], keyed: bool) -> None:
    """403 forbidden_host for a request under a name the server does not answer to."""
    host = request.headers.get("Host")
    if not host_allowed(host, bind, allow, keyed):
        name = host_name(host or "")
        raise ApiError(403, "forbidden_host",
                       f"this server does not answer to the host name {name!r}: a web page can point a name it "
                       "controls at this machine and send requests through the browser (DNS rebinding). Use "
                       f"localhost or the server's address, or start it with --host-allow {name} to allow the name")
