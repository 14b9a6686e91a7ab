"""Each sampling field is declared once (bubo/sampling.py: its type, bounds, default, doc and
flag), and everything else is derived from that declaration: here every field is checked, with
its bounds, in the validator (the library's and the server's), the OpenAPI document, the command
line's flags (`serve`'s defaults for requests, `run`'s settings, the chat's /set options) and the
library's typed keywords."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any

import pytest

from bubo import limits, sampling
from bubo.api import fields as api_fields
from bubo.api import openapi
from bubo.api.errors import ApiError
from bubo.cli import chat
from bubo.cli.flags import build_parser
from bubo.cli.serve import options as serve_options
from bubo.llm import Model
from bubo.sampling import FLT_TRUE_MIN, SamplingOptions, SamplingParams

FIELDS = dataclasses.fields(SamplingParams)
NUMERIC = [f for f in FIELDS if f.type in ("int", "float")]
FLT_MAX = openapi.FLT_MAX


def _bounds(f: dataclasses.Field[Any]) -> tuple[float, float]:
    """The field's declared range, as the native sampler holds it (a C float, or an int)."""
    lo, hi = f.metadata["lo"], f.metadata["hi"]
    if f.metadata["positive"]:
        lo = FLT_TRUE_MIN
    if f.type == "float":
        return (-FLT_MAX if lo is None else lo), (FLT_MAX if hi is None else hi)
    return lo, hi


def _past(v: float, up: bool, is_int: bool) -> float:
    if is_int:
        return v + 1 if up else v - 1
    step = max(abs(v) * 1e-6, 1e-9) if v else 1e-9
    return v + step if up else v - step


def test_every_field_is_declared():
    for f in FIELDS:
        assert set(f.metadata) >= {"doc", "lo", "hi", "flag", "short", "positive"}, f.name
        assert f.metadata["doc"], f"{f.name} has no doc"
        assert (f.default is not dataclasses.MISSING) or (f.default_factory is not dataclasses.MISSING), f.name
    assert [f for f in NUMERIC if f.type == "int" and (f.metadata["lo"] is None or f.metadata["hi"] is None)] == []


@pytest.mark.parametrize("f", NUMERIC, ids=[f.name for f in NUMERIC])
def test_the_validators_keep_the_declared_bounds(f):
    lo, hi = _bounds(f)
    is_int = f.type == "int"
    for value, ok in ((lo, True), (hi, True), (_past(lo, False, is_int), False), (_past(hi, True, is_int), False)):
        if not math.isfinite(value) or (not is_int and abs(value) > FLT_MAX and ok):
            continue
        if ok:
            SamplingParams(**{f.name: value})
        elif f.type == "float" and abs(value) > FLT_MAX:
            # past the C float's range: the server refuses it (the library's double is still finite)
            with pytest.raises(ApiError):
                api_fields.sampling_params({f.name: value})
            continue
        else:
            with pytest.raises(ValueError, match=f.name):
                SamplingParams(**{f.name: value})
        if f.name != "n_probs":  # the server reads n_probs as its own field
            if ok:
                api_fields.sampling_params({f.name: value})
            else:
                with pytest.raises(ApiError):
                    api_fields.sampling_params({f.name: value})


@pytest.mark.parametrize("f", NUMERIC, ids=[f.name for f in NUMERIC])
def test_a_value_equal_to_the_default_but_of_another_type_is_checked(f):
    """A field left at its default is not checked per request (its default was, once): a value
    that only compares equal to it (True for 1, 0.0 for 0) is still a value to check."""
    other = {bool: [], int: [float(f.default), bool(f.default)], float: [bool(f.default)]}[type(f.default)]
    if f.type == "float" and f.default in (0, 1):  # an int where a float is meant is taken (1 for 1.0)
        other.append(int(f.default))
    for value in other:
        if f.type == "float" and not isinstance(value, bool):
            assert SamplingParams(**{f.name: value}).replace(**{f.name: value})
            continue
        with pytest.raises(ValueError, match=f.name):
            SamplingParams(**{f.name: value})
        with pytest.raises(ValueError, match=f.name):
            SamplingParams().replace(**{f.name: value})


@pytest.mark.parametrize("f", NUMERIC, ids=[f.name for f in NUMERIC])
def test_the_openapi_document_has_the_declared_bounds(f):
    if f.name == "n_probs":
        assert "n_probs" not in openapi.SAMPLING
        return
    schema = openapi.SAMPLING[f.name]
    assert (schema["minimum"], schema["maximum"]) == _bounds(f)
    assert ("integer" in schema["type"]) == (f.type == "int")
    assert schema["description"] == f.metadata["doc"]


def test_the_openapi_document_has_every_field():
    assert set(openapi.SAMPLING) == {f.name for f in FIELDS} - {"n_probs"}
    assert set(openapi.SAMPLING) == set(api_fields._SAMPLING_FIELDS)
    assert openapi.SAMPLING["dry_sequence_breakers"]["maxItems"] == limits.MAX_DRY_BREAKERS


def test_the_command_line_flags_are_the_declared_fields():
    flagged = sampling.flagged()
    assert {f.metadata["flag"] for f in flagged} >= {"--temp", "--top-k", "--top-p", "--min-p", "--seed"}
    parser = build_parser()
    for command in ("serve", "run"):
        sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices[command]
        actions = {a.dest: a for a in sub._actions}
        for f in flagged:
            a = actions[f.name]
            assert f.metadata["flag"] in a.option_strings, (command, f.name)
            assert a.type is (int if f.type == "int" else float) and a.default is None
            assert f"{f.default}" in a.help and f.metadata["doc"] in a.help
        # only the declared fields set sampling
        assert not [d for d in actions if d in {g.name for g in FIELDS} and d not in {f.name for f in flagged}]
    # serve's flags become the requests' defaults, under the fields' names
    args = parser.parse_args(["serve", "--temp", "0.25", "--top-k", "7", "-s", "3", "--mirostat", "2"])
    assert serve_options(args).sampling == {"temperature": 0.25, "top_k": 7, "seed": 3, "mirostat": 2}
    # and run's are the chat session's options (Ollama's names are the fields' names)
    for f in flagged:
        assert chat.OPTIONS[f.name] is (int if f.type == "int" else float)
        assert chat.OPTION_HELP[f.name] == f.metadata["doc"]
        lo, _ = _bounds(f)
        chat.check_option(f.name, lo)
        if f.metadata["lo"] is not None:
            with pytest.raises(ValueError):
                chat.check_option(f.name, _past(lo, False, f.type == "int"))


@pytest.mark.parametrize("method", ["generate", "complete", "chat", "chat_stream"])
def test_the_library_keywords_are_the_declared_fields(method):
    fn = getattr(Model, method)
    sig = inspect.signature(fn)
    var = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [p.name for p in var] == ["options"]
    hints = typing.get_type_hints(fn, include_extras=True)
    assert typing.get_args(hints["options"]) == (SamplingOptions,)  # Unpack[SamplingOptions]
    assert typing.get_type_hints(fn)["sampling"] == SamplingParams | None
    assert sig.parameters["sampling"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_typed_keywords_are_the_fields_with_their_types():
    keys = typing.get_type_hints(SamplingOptions)
    assert list(keys) == [f.name for f in FIELDS]
    field_types = typing.get_type_hints(SamplingParams)
    for f in FIELDS:
        args = typing.get_args(keys[f.name])
        assert type(None) in args, f.name
        want = field_types[f.name]
        if f.type in ("int", "float"):
            assert want in args, f.name
        else:  # a collection: the keyword takes its abstract form (a list for a tuple)
            assert any(typing.get_origin(a) is not None for a in args), f.name
    assert SamplingOptions.__total__ is False


def test_keywords_are_checked():
    with pytest.raises(TypeError, match="temprature"):
        sampling.from_options({"temprature": 0.5})
    with pytest.raises(ValueError, match="top_p"):
        sampling.from_options({"top_p": 2})
    base = SamplingParams(temperature=0.1, seed=5)
    assert sampling.from_options({"seed": None, "top_k": 3}, base) == base.replace(top_k=3)


def test_the_docs_table_is_written_from_the_declarations():
    """docs/sampling.md's table is scripts/docs.py's rendering of the declarations."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, str(root / "scripts" / "docs.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = (root / "docs" / "sampling.md").read_text()
    for f in FIELDS:
        assert f"| `{f.name}` |" in text and f.metadata["doc"] in text
