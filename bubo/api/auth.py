"""API keys: with --api-key every route (health checks included) but GET / (bubo.api.
about.PUBLIC_PATHS: it says only that bubo runs, without a key) needs `Authorization: Bearer KEY` or
`x-api-key: KEY`; otherwise 401 with WWW-Authenticate: Bearer."""

from __future__ import annotations

import hmac

from flask import request

from bubo.api.errors import ApiError


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


def check_api_key(keys: list[str]) -> None:
    if not keys or request.method == "OPTIONS":  # a CORS preflight carries no credentials
        return
    given = request_keys()
    # compare with every key in constant time: no early exit that times which key matched
    ok = False
    for g in given:
        for k in keys:
            ok |= hmac.compare_digest(g.encode(), k.encode())
    if not ok:
        why = "no API key given" if not given else "the API key is not valid"
        raise ApiError(401, "invalid_api_key",
                       f"{why}: send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                       headers={"WWW-Authenticate": "Bearer"})


def load_key_file(path: str) -> list[str]:
    """One key per line; blank lines and # comments are skipped."""
    keys = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
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
