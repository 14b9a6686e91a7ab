"""The server's settings, as `python -m bubo serve` parses them (or as a WSGI host builds them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bubo.api.openai.stored import DEFAULT_MAX_RECORDS

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
OLLAMA_PORT = 11434  # serve --ollama also listens here
# every route's JSON body; a chat with a long document fits many times over
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# an SSE comment this often keeps a silent stream (a long prompt) alive through proxies
SSE_PING_SECONDS = 15.0
ALWAYS_SERVED_NAME = "bubo"
# llama-server's reasoning_format (--reasoning-format, or a request's field): none leaves a thinking
# model's <think> block in the content; deepseek (auto, the default, and deepseek-legacy alike)
# puts it in reasoning_content
REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")


@dataclass
class ServerConfig:
    served_model_name: str = "model"
    aliases: list[str] = field(default_factory=list)
    api_keys: list[str] = field(default_factory=list)
    caller_names: dict[str, str] = field(default_factory=dict)  # a named key's caller (bubo.api.auth)
    caller_max_slots: int | None = None  # --caller-max-slots: a caller's generations at once (bubo.api.callers)
    cors_origins: list[str] = field(default_factory=list)  # "*" allows any origin
    debug_hooks: bool = False
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    sse_ping_seconds: float = SSE_PING_SECONDS
    slots_enabled: bool = True  # --no-slots turns /slots off
    draining: bool = False  # shutting down: new requests get 503 shutting_down
    allow_special_in_content: bool = False  # control-token text in messages becomes control tokens
    # the command line's sampling flags (--temp, --top-k, ...): defaults of requests that do not
    # set the field; SamplingParams field names
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    n_predict: int | None = None  # -n: most tokens an answer generates when the request does not say
    webui: bool = True  # the chat page at / for browsers (--no-webui: the short about page)
    ui_defaults: dict[str, Any] = field(default_factory=dict)  # --ui-config: new conversations' settings
    prepare_timeout_s: float = 5.0  # --prepare-timeout: a request's work before it is generated (bubo.api.offload)
    host_allow: list[str] = field(default_factory=list)  # --host-allow: more names the Host header may give
    allow_copy: bool = False  # --allow-copy: /api/copy may copy a file where it cannot hard-link it
    reasoning_format: str = "auto"  # --reasoning-format: none leaves a model's <think> block in the content
    responses_max: int = DEFAULT_MAX_RECORDS  # --responses-max: stored responses kept at most
    contexts_path: str | None = None  # where context snapshots go (bubo serve: $BUBO_HOME/contexts)
    slot_save_path: str | None = None  # --slot-save-path: the folder of slot files (None: slot actions are off)
    responses_path: str | None = None  # their SQLite file (bubo serve: $BUBO_HOME's); None: in memory
    mcp: bool = True  # the Model Context Protocol endpoint, /mcp (--no-mcp turns it off)
    sign_key: str | None = None  # --sign-key: the Ed25519 key receipts are signed with (bubo.receipts)

    @property
    def model_names(self) -> list[str]:
        """Every name a request may use: the served id first, then the aliases, then "bubo"."""
        names: list[str] = []
        for n in [self.served_model_name, *self.aliases, ALWAYS_SERVED_NAME]:
            if n and n not in names:
                names.append(n)
        return names

    @property
    def debug_routes_enabled(self) -> bool:
        """/debug/* exists only when asked for and only on a loopback address."""
        return self.debug_hooks and is_loopback(self.host)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's local client
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
