"""Which models `bubo serve` serves, under which names, with which settings.

Sources, in this order (the first model is the default one, which "bubo" also names and which
loads at start):
  - every -m (a GGUF path or a catalog name), in the order given;
  - --models-dir DIR: every DIR/*.gguf (named after the file, without .gguf) and every
    subfolder holding exactly one .gguf file (named after the folder), in name order;
  - --models-preset FILE: sections with a `model` key define more models;
  - none of these: the models the store holds (`bubo list`) when it holds several, else the
    default catalog model.

A preset is an INI file: `[*]` holds defaults for every model, `[name]` one model's settings
(a model found elsewhere, or a new one with `model = PATH`); keys are the flag names without
dashes, long or short (`c`, `ctx-size`, `np`, `threads`, ...), plus `alias` and
`load-on-startup`. A flag given on the command line wins over the model's section, which wins over
`[*]`. An unknown key, a bad value, a section that names no model, or two models under one name
stop the server at start with an error naming the file, the section and the key.
"""

from __future__ import annotations

import configparser
import dataclasses
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bubo.api.options import ServeOptions
from bubo.chat.builtin import builtin_template
from bubo.engine.draft import DEFAULT_DRAFT, REQUANT_TYPES, DraftConfig
from bubo.engine.memory import check_cache_type
from bubo.engine.registry import DEFAULT_NAME, EngineSettings, ModelSpec

GLOBAL_SECTION = "*"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

log = logging.getLogger("bubo.serve")


class ModelsConfigError(ValueError):
    """The model sources or a preset file are wrong; the message says where."""


def served_name(model: str) -> str:
    """A model's id: a catalog name as given, a path as its file name without .gguf."""
    if os.sep in model or model.endswith(".gguf"):
        base = os.path.basename(model)
        return base[:-5] if base.endswith(".gguf") else base
    return model


def _int(least: int) -> Callable[[str], int]:
    def conv(v: str) -> int:
        n = int(v)
        if n < least:
            raise ValueError(f"give at least {least}")
        return n
    return conv


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected true or false")


def _cache_type_k(v: str) -> str:
    return check_cache_type(v.strip(), "K", k=True)


def _cache_type_v(v: str) -> str:
    return check_cache_type(v.strip(), "V", k=False)


def _template(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from None


def _adapters(value: str) -> tuple[tuple[str, float], ...]:
    """A preset's `lora = FILE[:SCALE], ...`: LoRA adapters (scale 1 unless given)."""
    out = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        path, sep, tail = item.rpartition(":")
        try:
            scale = float(tail) if sep else 1.0
        except ValueError:  # a colon of the file's name
            path, scale = item, 1.0
        if not sep:
            path = item
        if not math.isfinite(scale):
            raise ValueError(f"{item}: the scale must be a finite number")
        out.append((path, scale))
    if not out:
        raise ValueError("give one or more adapter files (FILE or FILE:SCALE, comma-separated)")
    return tuple(out)


# preset key -> (EngineSettings field or a spec field, converter); short and long flag names
_SETTING_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "c": ("n_ctx", _int(1)), "ctx-size": ("n_ctx", _int(1)),
    "t": ("n_threads", _int(1)), "threads": ("n_threads", _int(1)),
    "tb": ("n_threads_batch", _int(1)), "threads-batch": ("n_threads_batch", _int(1)),
    "np": ("n_parallel", _int(1)), "parallel": ("n_parallel", _int(1)),
    "b": ("n_batch", _int(1)), "batch-size": ("n_batch", _int(1)),
    "ub": ("n_ubatch", _int(1)), "ubatch-size": ("n_ubatch", _int(1)),
    "queue-size": ("queue_size", _int(0)),
    "chat-template-file": ("chat_template", _template),
    "chat-template": ("chat_template", builtin_template),
    "ctk": ("cache_type_k", _cache_type_k), "cache-type-k": ("cache_type_k", _cache_type_k),
    "ctv": ("cache_type_v", _cache_type_v), "cache-type-v": ("cache_type_v", _cache_type_v),
    "lora": ("lora", _adapters),
}
_SPEC_KEYS = {"m": "model", "model": "model", "a": "alias", "alias": "alias", "load-on-startup": "load-on-startup"}
KNOWN_KEYS = sorted(set(_SETTING_KEYS) | set(_SPEC_KEYS))


@dataclasses.dataclass
class _Section:
    settings: dict[str, Any]
    model: str | None = None
    aliases: tuple[str, ...] = ()
    load_on_startup: bool | None = None
    used: bool = False


def read_preset(path: str) -> dict[str, _Section]:
    """The sections of a preset file, every key checked (ModelsConfigError naming file, section
    and key)."""
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none", strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys as written
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f, source=path)
    except OSError as e:
        raise ModelsConfigError(f"--models-preset {path}: {e.strerror or e}") from None
    except (configparser.Error, UnicodeDecodeError) as e:
        raise ModelsConfigError(f"--models-preset {path}: {e}".replace("\n", " ")) from None
    out: dict[str, _Section] = {}
    for name in parser.sections():
        sec = _Section({})
        for raw_key, value in parser.items(name):
            key = raw_key.strip().lower()
            where = f"--models-preset {path}: [{name}] {raw_key}"
            if key in _SETTING_KEYS:
                field, conv = _SETTING_KEYS[key]
                try:
                    sec.settings[field] = conv(value.strip())
                except ValueError as e:
                    raise ModelsConfigError(f"{where} = {value!r}: {e}") from None
            elif key in _SPEC_KEYS:
                what = _SPEC_KEYS[key]
                if name == GLOBAL_SECTION and what != "load-on-startup":
                    raise ModelsConfigError(f"{where}: [{GLOBAL_SECTION}] holds settings for every model; "
                                            f"{raw_key} belongs in one model's section")
                if what == "model":
                    if not value.strip():
                        raise ModelsConfigError(f"{where} is empty: give a GGUF path or a catalog name")
                    sec.model = value.strip()
                elif what == "alias":
                    sec.aliases = tuple(a.strip() for a in value.split(",") if a.strip())
                else:
                    try:
                        sec.load_on_startup = _bool(value)
                    except ValueError as e:
                        raise ModelsConfigError(f"{where} = {value!r}: {e}") from None
            else:
                raise ModelsConfigError(f"{where}: unknown key; the keys are {', '.join(KNOWN_KEYS)} "
                                        "(flag names without dashes)")
        out[name] = sec
    return out


def _dir_models(path: str) -> list[tuple[str, str]]:
    """(name, file) of every model in a --models-dir folder."""
    d = Path(path)
    if not d.is_dir():
        raise ModelsConfigError(f"--models-dir {path}: not a folder")
    out = []
    for p in sorted(d.iterdir()):
        if p.is_file() and p.name.endswith(".gguf"):
            out.append((p.name[:-5], str(p)))
        elif p.is_dir():
            inside = sorted(q for q in p.iterdir() if q.is_file() and q.name.endswith(".gguf"))
            if len(inside) == 1:
                out.append((p.name, str(inside[0])))
    if not out:
        raise ModelsConfigError(f"--models-dir {path}: no .gguf files in it")
    return out


def _stored_adapters(models: list[tuple[str, str, str]]) -> dict[str, tuple[tuple[str, float], ...]]:
    """The store's LoRA adapters of each stored model (by the base model name the adapter records),
    at scale 0: served as base+adapter models, not on the base's own requests."""
    from bubo import lora, store
    from bubo.gguf import GGUFFile

    out: dict[str, tuple[tuple[str, float], ...]] = {}
    adapters = store.stored_adapters()
    for name, source, _ in models if adapters else []:
        try:
            path = store.resolve(source)
            with GGUFFile(str(path)) as f:
                own = f.metadata.get("general.name")
        except (store.UnknownModelError, OSError, ValueError):
            continue
        mine = []
        for a in adapters:
            if not lora.names_base(a.base_name, own):
                continue
            try:  # one that does not fit is left out, not the model with it
                lora.check_adapter_file(lora.read_adapter(a.path), path)
            except lora.AdapterError as e:
                log.warning("the stored adapter %s is not served: %s", a.path, e)
                continue
            mine.append((str(a.path), 0.0))
        if mine:
            out[name] = tuple(mine)
    return out


def _store_models() -> list[tuple[str, str]]:
    """(name, source) of the stored models when there are several (the default model first, if
    stored); else the default model alone (pulled if need be)."""
    from bubo import store

    stored = [(m.name, m.name) if m.name in store.CATALOG else (served_name(str(m.path)), str(m.path))
              for m in store.stored_models()]
    if len(stored) < 2:
        return [(store.DEFAULT_MODEL, store.DEFAULT_MODEL)]
    stored.sort(key=lambda m: m[0] != store.DEFAULT_MODEL)
    return stored


def cli_settings(args: ServeOptions, load_delay_s: float = 0.0,
                 load_mem_available: int | None = None) -> dict[str, Any]:
    """The engine settings given on the command line (or in BUBO_ARG_* variables)."""
    given: dict[str, Any] = {}
    for field, value in (("n_ctx", args.ctx_size), ("n_threads", args.threads),
                         ("n_threads_batch", args.threads_batch), ("n_parallel", args.parallel),
                         ("n_batch", args.batch_size), ("n_ubatch", args.ubatch_size),
                         ("queue_size", args.queue_size)):
        if value is not None:
            given[field] = value
    for field, flag, kind in (("cache_type_k", "--cache-type-k", args.cache_type_k),
                              ("cache_type_v", "--cache-type-v", args.cache_type_v)):
        if kind is not None:
            try:
                given[field] = check_cache_type(kind, flag, k=field == "cache_type_k")
            except ValueError as e:
                raise ModelsConfigError(str(e)) from None
    if args.chat_template_file and args.chat_template:
        raise ModelsConfigError(f"--chat-template {args.chat_template} and --chat-template-file "
                                f"{args.chat_template_file}: give one of them")
    if args.chat_template_file:
        try:
            given["chat_template"] = _template(args.chat_template_file)
        except ValueError as e:
            raise ModelsConfigError(f"--chat-template-file {args.chat_template_file}: {e}") from None
    if args.chat_template:
        try:
            given["chat_template"] = builtin_template(args.chat_template)
        except ValueError as e:
            raise ModelsConfigError(f"--chat-template {args.chat_template}: {e}") from None
    if load_delay_s:
        given["load_delay_s"] = load_delay_s
    if load_mem_available is not None:
        given["load_mem_available"] = load_mem_available
    if args.embedding:
        given["embedding"] = True
    if args.pooling is not None:
        given["pooling"] = args.pooling
    adapters = [(path, 1.0) for path in args.lora]
    for path, scale in args.lora_scaled:
        try:
            adapters.append((path, float(scale)))
        except (TypeError, ValueError):
            raise ModelsConfigError(f"--lora-scaled {path} {scale}: the scale must be a number") from None
        if not math.isfinite(adapters[-1][1]):
            raise ModelsConfigError(f"--lora-scaled {path} {scale}: the scale must be a finite number")
    if adapters:
        # llama-server's --lora-init-without-apply: loaded at scale 0, applied by POST /lora-adapters
        given["lora"] = tuple((path, 0.0 if args.lora_init_without_apply else scale) for path, scale in adapters)
    draft = draft_config(args)
    if draft is not DEFAULT_DRAFT:
        given["draft"] = draft
    return given


def draft_config(args: ServeOptions) -> DraftConfig | None:
    """Speculative decoding as --model-draft, --draft-max, --draft-min, --draft-p-min, --draft-requant, --spec-type
    and --no-draft say (None: off)."""
    model = args.model_draft
    if args.no_draft:
        if model is not None:
            raise ModelsConfigError("--no-draft and --model-draft: give one")
        return None
    spec = args.spec_type
    if spec is not None:
        types = [s.strip() for s in spec.split(",") if s.strip()]
        other = [s for s in types if s != "none" and not s.startswith(("ngram", "draft"))]
        if other:
            raise ModelsConfigError(f"--spec-type {other[0]}: not supported: bubo drafts by prompt lookup (ngram-*) or "
                                    "with a draft model (draft, with --model-draft)")
        if types == ["none"] or not types:
            if model is not None:
                raise ModelsConfigError("--spec-type none and --model-draft: give one")
            return None
        if any(s.startswith("draft") for s in types) and model is None:
            raise ModelsConfigError(f"--spec-type {spec}: a draft type needs a draft model (--model-draft)")
    n_max, n_min, p_min = args.draft_max, args.draft_min, args.draft_p_min
    requant = args.draft_requant
    if requant is not None:
        requant = requant.strip().lower()
        if requant != "none" and requant not in REQUANT_TYPES:
            raise ModelsConfigError(f"--draft-requant {requant}: give one of {', '.join(REQUANT_TYPES)} or none")
        if model is None:
            raise ModelsConfigError("--draft-requant: it is for a draft model's weights (--model-draft)")
    if n_max is None and n_min is None and p_min is None and model is None:
        return DEFAULT_DRAFT
    if n_max is not None and n_max < 1:
        raise ModelsConfigError(f"--draft-max {n_max}: give at least 1 (--no-draft turns drafting off)")
    n_max = DEFAULT_DRAFT.n_max if n_max is None else n_max
    n_min = DEFAULT_DRAFT.n_min if n_min is None else n_min
    if not 0 <= n_min <= n_max:
        raise ModelsConfigError(f"--draft-min {n_min}: give 0..{n_max} (--draft-max)")
    if p_min is not None and not 0.0 <= p_min <= 1.0:
        raise ModelsConfigError(f"--draft-p-min {p_min}: give 0..1")
    if model is not None:
        try:
            check_model(model, "--model-draft")
        except (OSError, ValueError, LookupError) as e:
            msg = str(e) if str(e).startswith("--model-draft") else f"--model-draft {model}: {e}"
            raise ModelsConfigError(msg) from None
    return DraftConfig(n_max=n_max, n_min=n_min, model=model,
                       p_min=DEFAULT_DRAFT.p_min if p_min is None else p_min,
                       requant=DEFAULT_DRAFT.requant if requant is None else None if requant == "none" else requant)


def model_specs(args: ServeOptions, load_delay_s: float = 0.0,
                load_mem_available: int | None = None) -> list[ModelSpec]:
    """Every model `bubo serve` was asked to serve (see the module docstring)."""
    found: list[tuple[str, str, str]] = []  # (name, source, origin)
    for m in args.models or []:
        found.append((served_name(m), m, "-m"))
    if args.models_dir:
        found += [(n, p, f"--models-dir {args.models_dir}") for n, p in _dir_models(args.models_dir)]
    preset = read_preset(args.models_preset) if args.models_preset else {}
    for name, section in preset.items():
        if name != GLOBAL_SECTION and section.model is not None:
            section.used = True
            found.append((name, section.model, f"--models-preset {args.models_preset} [{name}]"))
    if not found:
        found = [(n, s, "the store") for n, s in _store_models()]
    # the same file under the same name twice is one model
    seen: set[tuple[str, str]] = set()
    unique = []
    for name, source, origin in found:
        key = (name, os.path.realpath(source) if os.path.exists(source) else source)
        if key not in seen:
            seen.add(key)
            unique.append((name, source, origin))
    single = len(unique) == 1
    if not single and (args.served_model_name or args.alias):
        flag = "--served-model-name" if args.served_model_name else "-a/--alias"
        raise ModelsConfigError(f"{flag} names one model, but {len(unique)} are served: give each its names in a "
                                "--models-preset section (alias = ...)")
    glob = preset.get(GLOBAL_SECTION) or _Section({})
    cli = cli_settings(args, load_delay_s, load_mem_available)
    if not single and "lora" in cli:
        raise ModelsConfigError("--lora and --lora-scaled name adapters of one model, and several are served: give "
                                "each model its adapters in a --models-preset section (lora = FILE, FILE:SCALE)")
    stored = _stored_adapters(unique) if all(origin == "the store" for _, _, origin in unique) else {}
    specs = []
    for i, (name, source, origin) in enumerate(unique):
        sec = preset.get(name)
        if sec is not None:
            sec.used = True
        fields = {**glob.settings, **(sec.settings if sec else {}), **cli}
        if name in stored and "lora" not in fields:
            fields["lora"] = stored[name]
        aliases: tuple[str, ...] = sec.aliases if sec else ()
        if single:
            name = args.served_model_name or name
            aliases = tuple(args.alias) + aliases
        startup = i == 0
        for s in (glob, sec):
            if s is not None and s.load_on_startup is not None:
                startup = s.load_on_startup
        specs.append(ModelSpec(name, source, tuple(a for a in aliases if a not in (name, DEFAULT_NAME)),
                               EngineSettings(**fields), load_on_startup=startup or single, origin=origin))
    unused = [n for n, s in preset.items() if n != GLOBAL_SECTION and not s.used]
    if unused:
        names = ", ".join(s.name for s in specs)
        raise ModelsConfigError(f"--models-preset {args.models_preset}: [{unused[0]}] names no model: add "
                                f"model = PATH to it, or name one of the served models ({names})")
    return specs


def check_model(source: str, flag: str = "-m", embedding: bool = False) -> None:
    """Raise, naming the problem, when `source` (a path or a catalog name) cannot be served: a
    missing file, a file that is not GGUF or holds an architecture or block type bubo does not
    run, an unknown catalog name. A catalog model not stored yet passes (its load pulls it)."""
    from bubo import store
    from bubo.gguf import GGUFFile, check_model_file

    path = Path(source)
    if path.is_dir():
        raise ValueError(f"{flag} {source}: a folder, not a model file (serve every model in it with --models-dir)")
    if not path.is_file():
        if path.suffix == ".gguf" or os.sep in source:
            raise FileNotFoundError(f"{flag} {source}: no such file")
        store.catalog_entry(source)  # an unknown name raises, listing the catalog's
        return
    try:
        with GGUFFile(path) as f:
            check_model_file(f)
            arch = f.metadata.get("general.architecture")
    except OSError as e:
        raise ValueError(f"{flag} {source}: cannot read it: {e.strerror or e}") from None
    if embedding and arch != "bert":
        raise ValueError(f"--embedding: {flag} {source} is a text-generation model ({arch}), not an embedding model; "
                         "serve an encoder such as all-minilm:l6-v2, or drop --embedding to generate text with it")
