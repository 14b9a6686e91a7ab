"""The most of each list a request may hold: past it, the request is refused (the server's 400
names the field; the library raises RequestError) before any of it is looked at. Each bounds a
cost that grows with the list: matching stop strings and DRY's sequence breakers runs on the
engine thread for every token of every request, rendering a template and checking tools in the
request's preparation. The OpenAPI document (bubo/api/openapi.py) states them as maxItems.

The values leave room for any real use: OpenAI's own limits are 4 stop strings, 128 tools and 300
logit_bias entries; llama.cpp's DRY default has 4 breakers. (To allow only a few tokens, a grammar
says it in a line, where a logit_bias would list the rest of the vocabulary.)
"""

from __future__ import annotations

from typing import Any

from bubo.errors import RequestError

MAX_STOP = 64  # stop strings (stop, stop_sequences, options.stop)
MAX_STOP_CHARS = 500  # characters of one stop string
MAX_DRY_BREAKERS = 64  # dry_sequence_breakers
MAX_LOGIT_BIAS = 65_536  # logit_bias entries (OpenAI takes 300)
MAX_TOOLS = 128  # tools (functions) a request offers: OpenAI's limit
MAX_MESSAGES = 10_000  # messages of a conversation (a prompt of that many turns fills any context here)
# the most alternatives a token's answer may carry: each one is a JSON entry per generated token,
# so the answer grows with their product
MAX_N_PROBS = 100  # n_probs (llama-server)
MAX_TOP_LOGPROBS = 20  # top_logprobs (OpenAI's chat and Ollama's): OpenAI's limit
MAX_COMPLETION_LOGPROBS = 5  # logprobs of /v1/completions: OpenAI's limit


def check_count(items: Any, name: str, most: int, what: str = "items") -> None:
    """RequestError (invalid_value) naming the field when the list items holds more than most."""
    if isinstance(items, (list, tuple, dict)) and len(items) > most:
        raise RequestError("invalid_value", f"{name} has {len(items):,} {what}; at most {most:,} are accepted")


def check_stop(stop: list[str], name: str = "stop") -> None:
    """At most MAX_STOP stop strings of at most MAX_STOP_CHARS characters each."""
    check_count(stop, name, MAX_STOP, "strings")
    for i, s in enumerate(stop):
        if len(s) > MAX_STOP_CHARS:
            raise RequestError("invalid_value", f"{name}[{i}] has {len(s):,} characters; a stop string may have at "
                                                f"most {MAX_STOP_CHARS:,}")
