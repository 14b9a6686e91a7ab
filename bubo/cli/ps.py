"""`bubo ps`: what a running server serves (its models' status, context and busy slots)."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from bubo.cli.flags import csv


def ps(args: argparse.Namespace) -> int:
    """What a running server serves: GET /v1/models (each model's status and context), and
    GET /slots for a loaded model's busy slots."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(args.host, args.host)
    base = f"http://[{host}]:{args.port}" if ":" in host else f"http://{host}:{args.port}"
    keys = csv(args.api_key)
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}

    def get(path: str) -> Any:
        req = urllib.request.Request(base + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise RuntimeError(f"the server at {base} refused "
                                   f"{'the API key given' if keys else 'to answer without an API key'}: give its "
                                   "key with --api-key or BUBO_ARG_API_KEY") from None
            raise RuntimeError(f"the server at {base} answered GET {path} with HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise RuntimeError(f"no server answers at {base} ({why}); start one with `bubo serve`") from None
        except ValueError:
            raise RuntimeError(f"the server at {base} answered GET {path} with something that is not JSON") from None

    listing = get("/v1/models")
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise RuntimeError(f"the server at {base} answered GET /v1/models without a \"data\" list")
    aliases_of: dict[str, list[str]] = {}
    for m in data:
        if isinstance(m, dict) and isinstance(m.get("alias_of"), str):
            aliases_of.setdefault(m["alias_of"], []).append(str(m.get("id")))
    rows = [("NAME", "STATUS", "CONTEXT", "SLOTS", "ALIASES")]
    for m in data:
        if not isinstance(m, dict) or "alias_of" in m:
            continue
        status = m.get("status")
        state = str(status.get("value", "?")) if isinstance(status, dict) else "loaded"
        slots = "-"
        if state in ("loaded", "sleeping"):
            try:
                got = get(f"/slots?model={urllib.parse.quote(str(m.get('id', '')))}")
                if isinstance(got, list) and got:
                    slots = f"{sum(1 for s in got if s.get('is_processing'))}/{len(got)} busy"
            except RuntimeError:
                pass  # --no-slots, or a server without /slots
        given = [a for a in m.get("aliases") or [] if isinstance(a, str)]
        aliases = ", ".join(dict.fromkeys([*given, *aliases_of.get(str(m.get("id")), [])])) or "-"
        rows.append((str(m.get("id", "?")), state, str(m.get("context_length", "?")), slots, aliases))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0
