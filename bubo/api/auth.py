"""API keys: with --api-key every route (health checks included) but GET / (bubo.api.openapi's
PUBLIC_PATHS: it says only that bubo runs, without a key) needs `Authorization: Bearer KEY` or
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
