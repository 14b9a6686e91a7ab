"""Receipts: what an answer was made from and what it was, enough to make it again bit for bit.

A receipt names the model file (its served name, path and sha256), bubo's version, the kernel
level the answer ran at, the KV cache's types and size, the prompt's token ids, every sampling
parameter in force (the seed drawn when the request had none), the grammar, the end conditions
(max_tokens, stop strings, ignore_eos), and the answer: its token ids, a sha256 of their
log-probabilities, and why it ended. Answers do not depend on batching, the prefix cache, the
thread count or drafting, so rerunning the receipt's request on the same file at the same kernel
level gives the same tokens and log-probabilities; verify() does that and says where the first
difference is.

A receipt may be signed (Ed25519, with the `cryptography` package: pip install 'bubo[receipts]'):
the signature covers a sha256 of each field (each key of model, sampling, cache and grammar on
its own), so that a receipt changed after signing fails naming the field that changed.

    receipt = response["receipt"]            # a server's, with "receipt": true in the request
    verdict = bubo.receipts.verify(receipt)  # or `bubo verify-receipt FILE`
    print(verdict.status, verdict.message)   # "verified", "differs" or "cannot"
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
import secrets
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bubo.sampling import SamplingParams

VERSION = 1
ALGORITHM = "ed25519"
# x86-64's levels, lowest first; arm64 has scalar and neon
X86_LEVELS = ("scalar", "avx2", "avx512")
ARM_LEVELS = ("scalar", "neon")
FIELDS = ("version", "bubo", "created", "model", "kernel_level", "cache", "prompt_tokens", "sampling",
          "max_tokens", "stop", "ignore_eos", "grammar", "output_tokens", "logprobs_sha256", "finish_reason",
          "ended_early")
# the fields whose keys are signed one by one (a change names the key: "sampling.seed")
NESTED = ("model", "cache", "sampling", "grammar")
EXTRA = "pip install 'bubo[receipts]'"


class ReceiptError(ValueError):
    """A receipt that cannot be read (its shape), or a key that cannot be used."""


# --- making ------------------------------------------------------------------------------------


def logprobs_sha256(logprobs: Sequence[float]) -> str:
    """The sha256 of the log-probabilities as little-endian doubles, in order."""
    return hashlib.sha256(b"".join(struct.pack("<d", float(lp)) for lp in logprobs)).hexdigest()


def _number(v: float) -> float | str:
    """A float as JSON can carry it: -inf (a logit ban) as the string "-inf"."""
    return v if math.isfinite(v) else ("-inf" if v < 0 else "inf")


def sampling_json(params: SamplingParams) -> dict[str, Any]:
    """Every sampling field, as JSON (logit_bias as [token, bias] pairs, sorted)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if f.name == "logit_bias":
            v = [[int(t), _number(float(b))] for t, b in sorted(v.items())]
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def sampling_of(data: Mapping[str, Any]) -> SamplingParams:
    """sampling_json's inverse (ReceiptError for a field SamplingParams does not take)."""
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    extra = set(data) - names
    if extra:
        raise ReceiptError(f"sampling: unknown parameter {sorted(extra)[0]!r}")
    values = dict(data)
    try:
        if "logit_bias" in values:
            pairs = values["logit_bias"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ReceiptError("sampling.logit_bias: a list of [token, bias] pairs")
            values["logit_bias"] = {p[0]: (float(p[1]) if isinstance(p[1], str) else p[1]) for p in pairs}
        return SamplingParams(**values)
    except (TypeError, ValueError) as e:
        raise ReceiptError(f"sampling: {e}") from None


@dataclass(frozen=True)
class Made:
    """What a server knows of one answer when it makes its receipt."""

    model_name: str
    model_path: str
    model_sha256: str
    kernel_level: str
    cache_type_k: str
    cache_type_v: str
    n_ctx: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int | None
    stop: list[str]
    ignore_eos: bool
    grammar: tuple[str, str] | None  # (GBNF text, root rule)
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    ended_early: bool  # the route ended it (its one tool call was whole): a rerun may go on past it


def make(m: Made, version: str, signer: Signer | None = None) -> dict[str, Any]:
    """The receipt of m (signed by signer, if given)."""
    receipt: dict[str, Any] = {
        "version": VERSION,
        "bubo": version,
        "created": int(time.time()),
        "model": {"name": m.model_name, "path": m.model_path, "sha256": m.model_sha256},
        "kernel_level": m.kernel_level,
        "cache": {"type_k": m.cache_type_k, "type_v": m.cache_type_v, "n_ctx": m.n_ctx},
        "prompt_tokens": list(m.prompt),
        "sampling": sampling_json(m.params),
        "max_tokens": m.max_tokens,
        "stop": list(m.stop),
        "ignore_eos": m.ignore_eos,
        "grammar": {"gbnf": m.grammar[0], "root": m.grammar[1]} if m.grammar else None,
        "output_tokens": list(m.tokens),
        "logprobs_sha256": logprobs_sha256(m.logprobs),
        "finish_reason": m.finish_reason,
        "ended_early": m.ended_early,
    }
    return signer.sign(receipt) if signer is not None else receipt


def model_name(served: str, sha256: str) -> str:
    """The name a receipt gives its model: the catalog's, for a file the catalog has (by its
    sha256), so that verify-receipt can find it on another machine; else the name it was served as."""
    from bubo import store

    for entry in store.CATALOG.values():
        if entry.gguf_sha256 == sha256 or store.stored_sha256(entry.name) == sha256:
            return entry.name
    return served


# --- signing -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """value with integral floats as integers: 1.0 and 1 are one number (a JSON tool may write either)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def canonical(value: Any) -> bytes:
    """The one byte form of a JSON value that digests and signatures are taken over (keys sorted,
    integral floats as integers)."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def field_digests(receipt: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of each field (each key of the nested ones on its own: "sampling.seed"), the
    signature left out."""
    out: dict[str, str] = {}
    for name, value in receipt.items():
        if name == "signature":
            continue
        if name in NESTED and isinstance(value, dict):
            out[name] = hashlib.sha256(canonical(sorted(value))).hexdigest()  # which keys it has
            for key, v in value.items():
                out[f"{name}.{key}"] = hashlib.sha256(canonical(v)).hexdigest()
        else:
            out[name] = hashlib.sha256(canonical(value)).hexdigest()
    return out


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ReceiptError(f"signed receipts need the cryptography package: {EXTRA}") from None
    return ed25519


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any, what: str) -> bytes:
    try:
        if not isinstance(text, str):
            raise ValueError
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ReceiptError(f"{what}: not base64") from None


def _read_key_file(path: str | os.PathLike[str], what: str) -> bytes:
    """A key file's 32 bytes: base64 on one line (receipt_key() writes them so)."""
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except OSError as e:
        raise ReceiptError(f"{what} {path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ReceiptError(f"{what} {path}: not a key file (bubo receipt-key makes one)") from None
    raw = _unb64(text, f"{what} {path}")
    if len(raw) != 32:
        raise ReceiptError(f"{what} {path}: an Ed25519 key is 32 bytes in base64 (bubo receipt-key makes one)")
    return raw


class Signer:
    """Signs receipts with an Ed25519 private key (read from a file that receipt_key() wrote)."""

    def __init__(self, private_key_file: str | os.PathLike[str]):
        ed25519 = _crypto()
        self._key = ed25519.Ed25519PrivateKey.from_private_bytes(_read_key_file(private_key_file, "the signing key"))
        from cryptography.hazmat.primitives import serialization

        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        self.public_key = _b64(self._key.public_key().public_bytes(*raw))

    def sign(self, receipt: dict[str, Any]) -> dict[str, Any]:
        fields = field_digests(receipt)
        value = self._key.sign(canonical(fields))
        return {**receipt, "signature": {"algorithm": ALGORITHM, "public_key": self.public_key, "fields": fields,
                                         "value": _b64(value)}}


def receipt_key(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """A new key pair: the private key at path (readable by its owner only), the public key at
    path + ".pub"; each 32 bytes in base64 on one line. Written under temporary names, then renamed."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    dest = Path(path)
    pub = dest.with_name(dest.name + ".pub")
    for target, data, mode in ((dest, private, 0o600), (pub, public, 0o644)):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(_b64(data) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, target)  # whole, and never over a file that is there
        except FileExistsError:
            raise ReceiptError(f"{target} exists: give another name, or remove it first") from None
        except OSError as e:
            raise ReceiptError(f"{target}: cannot be written ({e.strerror or e})") from None
        finally:
            if tmp.exists():
                tmp.unlink()
    return dest, pub


def check_signature(receipt: Mapping[str, Any], public_key_file: str | os.PathLike[str] | None = None) -> str | None:
    """None when the signature holds (or the receipt is unsigned and no key is asked for); else
    what is wrong, naming the field: "sampling.seed: changed after the receipt was signed"."""
    sig = receipt.get("signature")
    if sig is None:
        return "signature: the receipt is not signed" if public_key_file is not None else None
    if not isinstance(sig, dict) or sig.get("algorithm") != ALGORITHM:
        return f"signature: not an {ALGORITHM} signature of this shape"
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        public = _unb64(sig.get("public_key"), "signature.public_key")
        value = _unb64(sig.get("value"), "signature.value")
    except ReceiptError as e:
        return str(e)
    if public_key_file is not None and public != _read_key_file(public_key_file, "the public key"):
        return "signature.public_key: signed with another key than the one given"
    fields = sig.get("fields")
    if not isinstance(fields, dict) or len(public) != 32:
        return "signature: its fields or public key are malformed"
    for name in receipt:
        if name not in FIELDS and name != "signature":
            return f"{name}: not a receipt field (added after the receipt was signed)"
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public).verify(value, canonical(fields))
    except (InvalidSignature, ValueError):
        return "signature: does not match the signed field digests (the signature or its digests were changed)"
    now = field_digests(receipt)
    for name in sorted(set(fields) | set(now)):
        if name not in now:
            return f"{name}: missing (it was signed)"
        if name not in fields:
            return f"{name}: added after the receipt was signed"
        if fields[name] != now[name]:
            return f"{name}: changed after the receipt was signed"
    return None


# --- reading -----------------------------------------------------------------------------------


def _typed(receipt: Mapping[str, Any], name: str, check: Callable[[Any], bool], what: str) -> Any:
    v = receipt.get(name)
    if not check(v):
        raise ReceiptError(f"{name}: {what}")
    return v


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(_int(t) and t >= 0 for t in v)


def check_shape(receipt: Mapping[str, Any]) -> None:
    """ReceiptError naming the first field that is missing or of the wrong kind."""
    if not isinstance(receipt, dict):
        raise ReceiptError("a receipt is a JSON object")
    for name in FIELDS:
        if name not in receipt:
            raise ReceiptError(f"{name}: missing")
    for name in receipt:
        if name not in FIELDS and name != "signature":
            raise ReceiptError(f"{name}: not a receipt field")
    if receipt["version"] != VERSION:
        raise ReceiptError(f"version: {receipt['version']!r} (this bubo reads version {VERSION})")
    model = _typed(receipt, "model", lambda v: isinstance(v, dict), "an object")
    for key in ("name", "path", "sha256"):
        if not isinstance(model.get(key), str):
            raise ReceiptError(f"model.{key}: missing or not text")
    cache = _typed(receipt, "cache", lambda v: isinstance(v, dict), "an object")
    if not (isinstance(cache.get("type_k"), str) and isinstance(cache.get("type_v"), str)
            and _int(cache.get("n_ctx")) and cache["n_ctx"] > 0):
        raise ReceiptError("cache: type_k, type_v (text) and n_ctx (a positive integer)")
    _typed(receipt, "kernel_level", lambda v: v in X86_LEVELS + ARM_LEVELS, "one of scalar, avx2, avx512, neon")
    _typed(receipt, "prompt_tokens", lambda v: _ids(v) and len(v) > 0, "a non-empty list of token ids")
    _typed(receipt, "output_tokens", _ids, "a list of token ids")
    _typed(receipt, "sampling", lambda v: isinstance(v, dict), "an object")
    _typed(receipt, "max_tokens", lambda v: v is None or (_int(v) and v > 0), "a positive integer or null")
    _typed(receipt, "stop", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of texts")
    _typed(receipt, "ignore_eos", lambda v: isinstance(v, bool), "true or false")
    _typed(receipt, "ended_early", lambda v: isinstance(v, bool), "true or false")
    _typed(receipt, "finish_reason", lambda v: v in ("stop", "length"), '"stop" or "length"')
    _typed(receipt, "logprobs_sha256", lambda v: isinstance(v, str) and len(v) == 64, "a sha256 in hex")
    grammar = receipt["grammar"]
    if grammar is not None and not (isinstance(grammar, dict) and isinstance(grammar.get("gbnf"), str)
                                    and isinstance(grammar.get("root"), str)):
        raise ReceiptError("grammar: null or {gbnf, root} (text)")
    sampling_of(receipt["sampling"])


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A receipt from a file: the receipt itself, or a response that carries one ("receipt");
    its fields are checked by verify()."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ReceiptError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReceiptError(f"{path}: not JSON ({e})") from None
    if isinstance(data, dict) and "receipt" in data and "output_tokens" not in data:
        data = data["receipt"]
    if not isinstance(data, dict):
        raise ReceiptError(f"{path}: a receipt is a JSON object")
    return data


# --- verifying ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """status: "verified" (every token, the log-probabilities and the ending are the same),
    "differs" (message says where first) or "cannot" (this process cannot run the receipt:
    the level, the model file, ...); exit_code is the command's (0, 1, 2)."""

    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "verified"

    @property
    def exit_code(self) -> int:
        return {"verified": 0, "differs": 1}.get(self.status, 2)


def levels_here() -> list[str]:
    """The kernel levels this process may run: the CPU's, at most BUBO_FORCE_ISA's cap."""
    from bubo import _kernels

    order = ARM_LEVELS if "neon" in _kernels.supported_isas() else X86_LEVELS
    have = [lv for lv in order if lv in _kernels.supported_isas()]
    cap = os.environ.get("BUBO_FORCE_ISA")
    if cap in have:
        have = have[: have.index(cap) + 1]
    return have


def level_problem(receipt: Mapping[str, Any]) -> str | None:
    """Why this process cannot run at the receipt's level (None: it can)."""
    level = receipt["kernel_level"]
    have = levels_here()
    if level not in have:
        return (f"kernel_level: the receipt was made at the {level} level, which is not available here "
                f"(this process runs {', '.join(have)})")
    return None


def model_file(receipt: Mapping[str, Any], model: str | os.PathLike[str] | None = None) -> Path:
    """The model file to rerun with: model if given, else the receipt's path if the file there has
    the receipt's sha256, else its catalog name (pulled if not stored). ReceiptError when none is found."""
    from bubo import store
    from bubo.engine.slotfile import model_sha256

    if model is not None:
        if not Path(model).is_file():
            raise ReceiptError(f"-m {model}: no such file")
        return Path(model)
    path = Path(receipt["model"]["path"])
    if path.is_file() and (model_sha256(str(path)) == receipt["model"]["sha256"]
                           or receipt["model"]["name"] not in store.CATALOG):
        return path
    name = receipt["model"]["name"]
    try:
        return store.resolve(name)
    except (OSError, ValueError, LookupError) as e:
        raise ReceiptError(f"model: neither its file {path} nor its name {name!r} is found here ({e}): give the "
                           "file with -m") from None


def describe(ids: Sequence[int], i: int, detok: Callable[[list[int]], str]) -> str:
    return f"{ids[i]} {detok([ids[i]])!r}" if i < len(ids) else "(nothing: the answer ended)"


def verify(receipt: Mapping[str, Any], *, model: str | os.PathLike[str] | None = None,
           public_key: str | os.PathLike[str] | None = None, n_threads: int | None = None) -> Verdict:
    """Rerun the receipt here and compare. The signature first (when there is one, or when
    public_key is given: then it must be signed by that key), then the model file's sha256, the
    kernel level (this process's: BUBO_FORCE_ISA must be set before bubo's kernels first run to
    use a lower one; `bubo verify-receipt` does that), then the tokens, their log-probabilities
    and the ending. Drafting is off: it never changes an answer."""
    if not isinstance(receipt, Mapping):
        return Verdict("cannot", "a receipt is a JSON object")
    try:
        problem = check_signature(receipt, public_key)
    except ReceiptError as e:  # no cryptography package, a key file that cannot be read
        return Verdict("cannot", str(e))
    if problem is not None:
        return Verdict("differs", problem)
    try:
        check_shape(receipt)
    except ReceiptError as e:
        return Verdict("cannot", f"the receipt is malformed: {e}")
    problem = level_problem(receipt)
    if problem is not None:
        return Verdict("cannot", problem)
    from bubo import _kernels

    level = receipt["kernel_level"]
    if _kernels.best_isa() != level:
        return Verdict("cannot", f"kernel_level: this process runs {_kernels.best_isa()} kernels and the receipt "
                                 f"was made at {level}: set BUBO_FORCE_ISA={level} before bubo runs, or use "
                                 "bubo verify-receipt")
    try:
        path = model_file(receipt, model)
    except ReceiptError as e:
        return Verdict("cannot", str(e))
    from bubo.engine.slotfile import model_sha256

    sha = model_sha256(str(path))
    if sha != receipt["model"]["sha256"]:
        return Verdict("cannot", f"model.sha256: the file {path} has sha256 {sha[:16]}..., the receipt's model "
                                  f"{receipt['model']['sha256'][:16]}...")
    sig = receipt.get("signature")
    signed = ("; not signed" if sig is None else "; signed by the key given" if public_key is not None else
              f"; signed by key {sig['public_key'][:12]}... (not checked against a key of yours: --public-key)")
    return _rerun(receipt, path, n_threads, signed)


def _rerun(receipt: Mapping[str, Any], path: Path, n_threads: int | None, signed: str = "") -> Verdict:
    from bubo._grammar import Grammar
    from bubo.engine.types import GenerationRequest
    from bubo.llm import Model

    cache = receipt["cache"]
    g = receipt["grammar"]
    try:
        grammar = Grammar(g["gbnf"], g["root"]) if g else None
    except ValueError as e:
        return Verdict("differs", f"grammar.gbnf: {e}")
    req = GenerationRequest(list(receipt["prompt_tokens"]), sampling_of(receipt["sampling"]), receipt["max_tokens"],
                            list(receipt["stop"]), ignore_eos=receipt["ignore_eos"], grammar=grammar, draft_max=0)
    want = list(receipt["output_tokens"])
    try:
        with Model(path, n_ctx=cache["n_ctx"], n_threads=n_threads, draft=False, cache_type_k=cache["type_k"],
                   cache_type_v=cache["type_v"]) as m:
            if m.n_ctx != cache["n_ctx"]:
                return Verdict("cannot", f"cache.n_ctx: the receipt's context of {cache['n_ctx']} tokens is over "
                                         f"the model's trained context ({m.n_ctx}), which a library Model keeps to")
            got, logprobs, finish = m.run_request(req, len(want) if receipt["ended_early"] else None)
            detok = m.detokenize
            for i in range(max(len(got), len(want))):
                if i >= len(got) or i >= len(want) or got[i] != want[i]:
                    if receipt["ended_early"] and i >= len(want):
                        break
                    return Verdict("differs", f"output_tokens[{i}]: the receipt has {describe(want, i, detok)}, "
                                              f"this run {describe(got, i, detok)}")
    except Exception as e:  # noqa: BLE001 - any failure to run it here is a verdict: cannot
        return Verdict("cannot", f"the receipt's request cannot run on {path}: {e}")
    if logprobs_sha256(logprobs[: len(want)]) != receipt["logprobs_sha256"]:
        return Verdict("differs", "logprobs_sha256: every token is the same but their log-probabilities differ")
    if not receipt["ended_early"] and finish != receipt["finish_reason"]:
        return Verdict("differs", f"finish_reason: the receipt has {receipt['finish_reason']!r}, this run {finish!r}")
    return Verdict("verified", f"verified: {len(want)} tokens, the same tokens and log-probabilities, at the "
                               f"{receipt['kernel_level']} level on {path.name}{signed}")
