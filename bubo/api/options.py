"""ServeOptions: everything `bubo.api.serve.serve` is told, in the spirit of llama.cpp's
common_params. The command line (bubo/cli) fills one from its flags; a program that starts the
server itself builds one. Each default is its owner's: the store's default model, the registry's
models at once, the HTTP layer's timeouts, the server config's host and port."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from bubo import store
from bubo.api.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig
from bubo.api.http import Limits
from bubo.engine.registry import DEFAULT_MODELS_MAX

DRAIN_TIMEOUT_S = 30.0  # on SIGTERM, how long requests in flight may go on
LOG_FORMATS = ("text", "json")
POOLINGS = ("mean", "cls", "last")


@dataclass
class ServeOptions:
    # the models
    # the models to serve (every -m; a program serving one model gives models=[name]); none: the
    # store's models, the default one first. model is the first of them (or the default's name)
    model: str = store.DEFAULT_MODEL
    models: list[str] = field(default_factory=list)
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int = DEFAULT_MODELS_MAX
    no_models_autoload: bool = False
    sleep_idle_seconds: float | None = None
    served_model_name: str | None = None
    alias: list[str] = field(default_factory=list)
    embedding: bool = False
    pooling: str | None = None
    chat_template_file: str | None = None
    chat_template: str | None = None  # one of llama.cpp's built-in template names (bubo.chat.builtin)
    # the engine (None: the engine's default)
    ctx_size: int | None = None
    threads: int | None = None
    threads_batch: int | None = None
    parallel: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    queue_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    # speculative decoding
    model_draft: str | None = None
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None
    draft_requant: str | None = None
    no_draft: bool = False
    spec_type: str | None = None
    # requests' defaults: SamplingParams fields (--temp, --top-k, ...: the rest are SamplingParams')
    sampling: dict[str, Any] = field(default_factory=dict)
    n_predict: int | None = None
    reasoning_format: str = "auto"  # bubo.api.config.REASONING_FORMATS: where a thinking model's reasoning goes
    slot_save_path: str | None = None  # llama-server's: the folder POST /slots/{id}?action=save writes to
    responses_max: int = ServerConfig.responses_max  # stored responses kept at most (the least recently used go)
    sign_key: str | None = None  # the Ed25519 private key file receipts are signed with (bubo receipt-key)
    lora: list[str] = field(default_factory=list)  # --lora FILE (repeated): LoRA adapters at scale 1
    lora_scaled: list[tuple[str, float]] = field(default_factory=list)  # --lora-scaled FILE SCALE
    lora_init_without_apply: bool = False  # the adapters start at scale 0 (POST /lora-adapters applies them)
    cache_reuse: int = 0  # llama-server's --cache-reuse: accepted (the prefix cache does the reuse bubo does)
    # HTTP
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    ollama: bool = False
    no_webui: bool = False
    ui_config: str | None = None
    no_slots: bool = False
    allow_special_in_content: bool = False
    timeout: float = Limits.timeout_s
    header_timeout: float = Limits.header_s
    keepalive_timeout: float = Limits.keepalive_s
    write_timeout: float = Limits.write_s
    prepare_timeout: float = ServerConfig.prepare_timeout_s
    drain_timeout: float = DRAIN_TIMEOUT_S
    max_connections: int | None = None
    host_allow: list[str] = field(default_factory=list)
    allow_copy: bool = False
    api_key: list[str] = field(default_factory=list)
    api_key_file: str | None = None
    caller_max_slots: int | None = None
    no_mcp: bool = False
    cors_origins: list[str] = field(default_factory=list)
    debug_hooks: bool = False
    # the log
    verbose: bool = False
    log_disable: bool = False
    log_format: str = "text"
    log_verbosity: int | None = None  # llama.cpp's threshold: 0-1 errors, 2 warnings, 3 info, 4+ debug
    notes: list[str] = field(default_factory=list)  # lines to log at start (flags accepted and ignored)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default, by name (the command line's flags show and use them)."""
        out: dict[str, Any] = {}
        for f in fields(cls):
            out[f.name] = f.default_factory() if callable(f.default_factory) else f.default
        return out
