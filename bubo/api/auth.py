"""API keys: with --api-key every route (health checks included) needs
`Authorization: Bearer KEY` or `x-api-key: KEY`; otherwise 401 with WWW-Authenticate: Bearer."""

from __future__ import annotations

import hmac

from flask import request

from bubo.api.errors import ApiError


def request_key() -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = request.headers.get("x-api-key", "").strip()
    return key or None


def check_api_key(keys: list[str]) -> None:
    if not keys or request.method == "OPTIONS":  # a CORS preflight carries no credentials
        return
    given = request_key()
    # compare with every key in constant time: no early exit that times which key matched
    ok = False
    if given is not None:
        for k in keys:
            ok |= hmac.compare_digest(given.encode(), k.encode())
    if not ok:
        why = "no API key given" if given is None else "the API key is not valid"
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
