"""What the prefix-aware router routes by: a request's leading prompt, as chained block hashes.

bubo's prefix cache indexes a prompt's full KV blocks, each by its tokens and every token before
it, so two prompts share cached blocks exactly as far as their leading tokens agree. The ingress
has no model and no tokenizer, so it cuts the same thing one step earlier: the parts of the body
that the chat template renders, in the order it renders them (model, tools, system, each
message; or a completion's prompt), as canonical JSON text, hashed in blocks of BLOCK_BYTES bytes,
each hash chained to the one before. Two requests whose leading messages agree share their
leading hashes; the first difference (a new user turn) changes that block's hash and all after
it, as it changes the prompt's tokens and the cache's blocks from there on. Only full blocks
count, as in the cache. No Ray here: the ingress calls this, the router reads its result."""

from __future__ import annotations

import hashlib
import json
from typing import Any

BLOCK_BYTES = 256  # about 64 tokens of English: two of the prefix cache's 32-token blocks
MAX_BLOCKS = 256  # the leading 64 KiB of a prompt decide its route

# route -> the body's fields that the prompt is made of, in prompt order
_CHAT_FIELDS = ("model", "tools", "functions", "system", "instructions", "messages", "input")
_PROMPT_FIELDS = ("model", "system", "prompt", "input_prefix", "input_extra")
_PROMPT_PATHS = ("/v1/completions", "/completions", "/completion", "/infill", "/api/generate")


def routing_parts(path: str, body: Any) -> list[Any]:
    """The body's prompt-making values, in prompt order ([] for a route without a prompt).
    A conversation's messages come one part each, so a new turn leaves earlier parts alone."""
    if not isinstance(body, dict):
        return []
    fields = _PROMPT_FIELDS if path.rstrip("/") in _PROMPT_PATHS else _CHAT_FIELDS
    parts: list[Any] = []
    for f in fields:
        v = body.get(f)
        if v is None:
            continue
        if f in ("messages", "input") and isinstance(v, list):
            parts.extend(v)
        elif f == "prompt" and isinstance(v, list) and v and not isinstance(v[0], int):
            parts.append(v[0])  # a batch of prompts: route by the first
        else:
            parts.append(v)
    return parts


def block_hashes(data: bytes, block_bytes: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """One 64-bit hash per full block of data, each covering every byte before it too."""
    out: list[int] = []
    prev = b""
    for i in range(min(len(data) // block_bytes, max_blocks)):
        prev = hashlib.blake2b(prev + data[i * block_bytes:(i + 1) * block_bytes], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return tuple(out)


def prefix_key(path: str, raw_body: bytes, content_type: str = "application/json") -> tuple[int, ...]:
    """The chained block hashes of a request's leading prompt; () where it has none (a GET, a
    body that is not JSON: those go to the least loaded replica)."""
    if not raw_body or "json" not in (content_type or "application/json"):
        return ()
    try:
        body = json.loads(raw_body)
    except (ValueError, RecursionError):
        return ()  # the replica answers it with its 400
    parts = routing_parts(path, body)
    if not parts:
        return ()
    text = "\x1e".join(json.dumps(p, sort_keys=True, ensure_ascii=False, separators=(",", ":")) for p in parts)
    return block_hashes(text.encode("utf-8", "surrogatepass"))
