"""Receipts (bubo.receipts): "receipt": true on the five generating routes gives an answer's
receipt, which reruns bit for bit: in the library (bubo.receipts.verify), with `bubo verify-receipt`,
after the server restarts, and at the kernel level it was made at on a CPU that has more. A signed
receipt changed in any one field fails, naming that field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from client import call

from bubo import _kernels, receipts

from .conftest import MODEL, start_server

pytestmark = pytest.mark.models

REPEAT = "Repeat this line exactly: the quick brown fox jumps over the lazy dog, the quick brown fox."
YES_NO = 'root ::= "yes" | "no"'
MSGS = [{"role": "user", "content": REPEAT}]


def _requests() -> list[tuple[str, dict[str, Any]]]:
    """20 requests over the five routes: greedy and seeded (one seed left out: drawn and recorded),
    with and without a grammar, drafted (prompt lookup, the server's default) and not, streamed and not."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(4):
        sampling: dict[str, Any] = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": 7 + i}
        if i == 3:
            sampling = {"temperature": 0.9}  # no seed: the server draws one and the receipt has it
        extra: dict[str, Any] = {**sampling, "receipt": True, "stream": i >= 2}
        if i == 1:
            extra["speculative.n_max"] = 0  # not drafted
        grammar = i in (1, 2)
        out += [
            ("/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 12, **extra,
                                      **({"response_format": {"type": "json_object"}} if grammar else {})}),
            ("/v1/completions", {"model": MODEL, "prompt": REPEAT, "max_tokens": 12, **extra,
                                 **({"grammar": YES_NO} if grammar else {})}),
            ("/v1/responses", {"model": MODEL, "input": REPEAT, "max_output_tokens": 12, **extra,
                               **({"text": {"format": {"type": "json_object"}}} if grammar else {})}),
            ("/v1/messages", {"model": MODEL, "messages": MSGS, "max_tokens": 12, **extra}),
            ("/completion", {"prompt": REPEAT, "n_predict": 12, **extra, **({"grammar": YES_NO} if grammar else {})}),
        ]
    return out


def _receipt_of(path: str, body: dict[str, Any], data: bytes) -> tuple[dict[str, Any], int]:
    """The receipt in an answer (a stream's last chunk with one), and the tokens drafted for it."""
    if not body.get("stream"):
        doc = json.loads(data)
        timings = doc.get("timings") or {}
        return doc["receipt"], int(timings.get("draft_n", 0))
    found: list[dict[str, Any]] = []
    drafted = 0
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        holder = ev.get("response", ev) if isinstance(ev.get("response"), dict) else ev
        if "receipt" in holder:
            found.append(holder["receipt"])
        drafted += int((ev.get("timings") or {}).get("draft_n", 0))
    assert len(found) == 1, (path, data[-800:])  # the last chunk only
    return found[0], drafted


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    p = subprocess.run([sys.executable, "-m", "bubo", "receipt-key", str(folder / "k")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    again = subprocess.run([sys.executable, "-m", "bubo", "receipt-key", str(folder / "k")], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "exists" in again.stderr, again.stderr  # a key is never replaced
    assert (folder / "k").stat().st_mode & 0o077 == 0  # the private key: its owner's only
    return folder / "k", folder / "k.pub"


@pytest.fixture(scope="module")
def made(keys: tuple[Path, Path]) -> list[dict[str, Any]]:
    """The 20 receipts, from a server that signs them."""
    out = []
    drafted = 0
    with start_server("-np", "2", "--sign-key", str(keys[0])) as srv:
        srv.wait_ready()
        for path, body in _requests():
            status, _, data = call(srv.url + path, "POST", body, timeout=120)
            assert status == 200, (path, data[:400])
            r, d = _receipt_of(path, body, data)
            drafted += d
            out.append(r)
        # not asked for: no receipt
        status, _, data = call(srv.url + "/v1/completions", "POST", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert status == 200 and "receipt" not in json.loads(data)
        status, _, data = call(srv.url + "/v1/completions", "POST", {"model": MODEL, "prompt": "Hi", "receipt": "yes"})
        assert status == 400 and "receipt" in json.loads(data)["error"]["message"]
    assert drafted > 0  # some answers were drafted (prompt lookup: the answer repeats the prompt)
    return out


def test_receipts_of_every_route_verify_in_the_library(made, keys):
    from jsonschema import Draft202012Validator

    from bubo.api import openapi

    schema = {"$defs": openapi.schemas(), **openapi.schemas()["Receipt"]}
    schema = json.loads(json.dumps(schema).replace("#/components/schemas/", "#/$defs/"))
    assert len(made) == 20
    for r in made:
        Draft202012Validator(schema).validate(r)
        assert r["kernel_level"] == _kernels.best_isa() and r["model"]["name"] == MODEL
        assert r["sampling"]["seed"] != -1 and r["signature"]["algorithm"] == "ed25519"
        verdict = receipts.verify(r, public_key=keys[1])
        assert verdict.ok and verdict.exit_code == 0, (verdict, r["prompt_tokens"][:8])
    assert {r["grammar"] is not None for r in made} == {True, False}
    assert {r["sampling"]["temperature"] for r in made} == {0, 0.9}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "bubo", "verify-receipt", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_a_restarted_server_makes_the_same_answers_and_the_command_verifies_them(made, keys, tmp_path):
    """A new server, the same requests with the seeds the receipts recorded: the same tokens and
    log-probabilities; and `bubo verify-receipt` (with the public key) verifies the first ones."""
    with start_server("-np", "1") as srv:
        srv.wait_ready()
        for (path, body), r in list(zip(_requests(), made))[:10]:
            body = {**body, "seed": r["sampling"]["seed"]}
            status, _, data = call(srv.url + path, "POST", body, timeout=120)
            assert status == 200, data[:300]
            again, _ = _receipt_of(path, body, data)
            assert "signature" not in again  # this server has no key
            for name in ("prompt_tokens", "output_tokens", "logprobs_sha256", "finish_reason", "sampling"):
                assert again[name] == r[name], (path, name)
    for r in made[:3]:
        f = tmp_path / "r.json"
        f.write_text(json.dumps({"choices": [], "receipt": r}))  # a whole response works too
        p = _cli(str(f), "--public-key", str(keys[1]))
        assert p.returncode == 0 and p.stdout.startswith("verified: "), p.stdout + p.stderr


@pytest.mark.skipif("avx2" not in _kernels.supported_isas(), reason="this CPU has no AVX2")
def test_a_receipt_verifies_at_its_level_and_a_higher_one_is_not_available_below_it(made, tmp_path):
    forced = {"BUBO_FORCE_ISA": "avx2"}
    with start_server("-np", "1", env=forced) as srv:
        srv.wait_ready()
        path, body = _requests()[1]  # a greedy completion
        status, _, data = call(srv.url + path, "POST", body, timeout=120)
        r, _ = _receipt_of(path, body, data)
    assert r["kernel_level"] == "avx2"
    f = tmp_path / "avx2.json"
    f.write_text(json.dumps(r))
    p = _cli(str(f), env=forced)
    assert p.returncode == 0 and "at the avx2 level" in p.stdout, p.stdout + p.stderr
    p = _cli(str(f))  # this process runs its best level: the command starts again at avx2
    assert p.returncode == 0 and "at the avx2 level" in p.stdout, p.stdout + p.stderr
    if "avx512" not in _kernels.supported_isas():
        pytest.skip("this CPU has no AVX-512: the higher level's refusal is not shown")
    assert made[1]["kernel_level"] == "avx512"
    f.write_text(json.dumps(made[1]))
    p = _cli(str(f), env=forced)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "kernel_level: the receipt was made at the avx512 level, which is not available here" in p.stderr
    wrong = {k: v for k, v in made[1].items() if k != "signature"} | {"kernel_level": "avx2"}
    verdict = receipts.verify(wrong)  # this process runs avx512 kernels: it says so, it does not rerun
    assert verdict.status == "cannot" and "BUBO_FORCE_ISA=avx2" in verdict.message, verdict


def _tamperings(r: dict[str, Any]) -> list[tuple[str, Any]]:
    """(the field named, a change) x 30: each changes one field of a signed receipt."""
    def at(*keys: Any, value: Any) -> Any:
        def change(d: dict[str, Any]) -> None:
            target = d
            for k in keys[:-1]:
                target = target[k]
            target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value
        return change

    def flip(v: str) -> str:
        return v[:-1] + ("0" if v[-1] != "0" else "1")

    return [
        ("output_tokens", at("output_tokens", 0, value=lambda t: t + 1)),
        ("output_tokens", at("output_tokens", -1, value=lambda t: t + 1)),
        ("output_tokens", at("output_tokens", value=lambda ts: ts[:-1])),
        ("prompt_tokens", at("prompt_tokens", 1, value=lambda t: t + 1)),
        ("prompt_tokens", at("prompt_tokens", value=lambda ts: ts + [13])),
        ("sampling.seed", at("sampling", "seed", value=lambda s: s + 1)),
        ("sampling.temperature", at("sampling", "temperature", value=0.7)),
        ("sampling.top_k", at("sampling", "top_k", value=20)),
        ("sampling.top_p", at("sampling", "top_p", value=0.5)),
        ("sampling.min_p", at("sampling", "min_p", value=0.0)),
        ("sampling.repeat_penalty", at("sampling", "repeat_penalty", value=1.3)),
        ("sampling.logit_bias", at("sampling", "logit_bias", value=[[13, -5.0]])),
        ("sampling.mirostat", at("sampling", "mirostat", value=2)),
        ("max_tokens", at("max_tokens", value=99)),
        ("stop", at("stop", value=["."])),
        ("ignore_eos", at("ignore_eos", value=True)),
        ("grammar", at("grammar", value={"gbnf": YES_NO, "root": "root"})),
        ("model.sha256", at("model", "sha256", value=flip)),
        ("model.path", at("model", "path", value="/elsewhere/model.gguf")),
        ("model.name", at("model", "name", value="qwen2.5-coder:0.5b")),
        ("kernel_level", at("kernel_level", value="scalar")),
        ("cache.type_k", at("cache", "type_k", value="q8_0")),
        ("cache.n_ctx", at("cache", "n_ctx", value=512)),
        ("logprobs_sha256", at("logprobs_sha256", value=flip)),
        ("finish_reason", at("finish_reason", value=lambda v: "stop" if v == "length" else "length")),
        ("ended_early", at("ended_early", value=True)),
        ("created", at("created", value=lambda v: v - 3600)),
        ("bubo", at("bubo", value="9.9.9")),
        ("signature", at("signature", "value", value=lambda v: ("A" if v[0] != "A" else "B") + v[1:])),
        ("signature.public_key", at("signature", "public_key", value=lambda v: ("A" if v[0] != "A" else "B") + v[1:])),
    ]


def test_each_of_30_single_field_changes_to_a_signed_receipt_fails_naming_the_field(made, keys):
    r = next(x for x in made if x["grammar"] is None and x["sampling"]["temperature"] > 0)
    changes = _tamperings(r)
    assert len(changes) == 30
    for name, change in changes:
        bad = copy.deepcopy(r)
        change(bad)
        assert bad != r, name
        verdict = receipts.verify(bad, public_key=keys[1])
        assert verdict.status == "differs" and verdict.message.startswith(name + ":"), (name, verdict)
    # a field added or removed after signing, and an unsigned receipt where a signed one is asked for
    assert receipts.verify({**r, "note": "x"}, public_key=keys[1]).message.startswith("note: not a receipt field")
    # a key that spells a nested field's digest name cannot stand in for it
    forged = copy.deepcopy(r)
    forged["sampling"]["seed"] += 1
    forged["sampling.seed"] = r["sampling"]["seed"]
    assert receipts.verify(forged).message.startswith("sampling.seed: not a receipt field")
    # rewritten by a JSON tool that writes 1.0 as 1: still the same receipt
    plain = json.loads(json.dumps(r).replace(": 1.0,", ": 1,"))
    assert json.dumps(plain) != json.dumps(r) and receipts.check_signature(plain, keys[1]) is None
    assert receipts.verify({k: v for k, v in r.items() if k != "stop"}).message.startswith("stop: missing")
    unsigned = {k: v for k, v in r.items() if k != "signature"}
    assert receipts.verify(unsigned, public_key=keys[1]).message == "signature: the receipt is not signed"


def test_an_unsigned_receipt_changed_is_found_by_its_rerun(made):
    r = {k: v for k, v in made[0].items() if k != "signature"}
    verdict = receipts.verify(r)
    assert verdict.ok and verdict.message.endswith("; not signed"), verdict
    bad = {**r, "output_tokens": [*r["output_tokens"][:3], r["output_tokens"][3] + 1, *r["output_tokens"][4:]]}
    verdict = receipts.verify(bad)
    assert verdict.status == "differs" and verdict.message.startswith("output_tokens[3]: the receipt has "), verdict
    lp = {**r, "logprobs_sha256": "0" * 64}
    assert receipts.verify(lp).message.startswith("logprobs_sha256: every token is the same")
    other = receipts.verify(r, model=str(Path(r["model"]["path"]).with_name("nothing.gguf")))
    assert other.status == "cannot" and "no such file" in other.message


def test_the_command_says_what_it_cannot_read(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    p = _cli(str(f))
    assert p.returncode == 2 and "not JSON" in p.stderr, p.stderr
    f.write_text(json.dumps({"version": 1}))
    p = _cli(str(f))
    assert p.returncode == 2 and "the receipt is malformed: bubo: missing" in p.stderr, p.stderr
    p = _cli(str(tmp_path / "none.json"))
    assert p.returncode == 2 and "cannot be read" in p.stderr, p.stderr
    p = _cli(str(f), "-t", "0")
    assert p.returncode == 2 and "-t 0: give a positive number" in p.stderr, p.stderr


def test_serve_refuses_a_sign_key_it_cannot_use(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    p = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", MODEL, "--sign-key", str(bad), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--sign-key: the signing key" in p.stderr.strip().splitlines()[-1], p.stderr

