"""POST /v1/systemone: Ollama's decision API. A `state` (text, or an object of named texts) and
named `questions`, each with a closed set of answers; every answer comes back as probabilities,
and nothing is generated.

Each question is asked in a chat of its own: the state in the system message, the question and its
options lettered A, B, C... in the user's, and its answer is the model's next-token probability
for each letter's token, renormalised over the options (a 400 names the question that has fewer
than 2 or more than 26). Three kinds:

    choice  criteria {name: description}   -> choice (the likeliest), probabilities by name
    noul    (A yes, B no)                  -> noul, the probability of yes
    score   criteria [ordered legend]      -> score (the expected index), probabilities by index

confidence = 1 - the normalised entropy of the probabilities (1: all on one option; 0: even).
The questions share the state, which comes first in every prompt: the first question reads it and
the prefix cache keeps its full blocks, which every other question then starts from, so N
questions cost the state once plus their own tokens (X-Bubo-Evaluated-Tokens: the positions the
model read). usage.input_tokens counts every question's whole prompt, as Ollama does; output_tokens
is 0. Errors are in Ollama's shape ({"error": "..."})."""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, jsonify

from bubo.api import openapi as oa
from bubo.api import pipeline
from bubo.api.errors import ApiError
from bubo.api.request import debug_mem_available, json_body, resolve_model, runtime_of, use_model
from bubo.engine.protocol import Stream
from bubo.engine.types import GenerationRequest
from bubo.runtime import Runtime
from bubo.sampling import SamplingParams

blueprint = Blueprint("decision", __name__)

KINDS = ("choice", "noul", "score")
MAX_QUESTIONS = 64
MIN_OPTIONS, MAX_OPTIONS = 2, 26
MAX_TEXT_CHARS = 100_000  # an instruction or option: the prompt's length is the context's to bound
SYSTEM = ("Read the state below, then answer the user's question about it with the letter of exactly one of "
          "its options.\n\n# State\n\n{state}")
ASK = "{instructions}\n\n{options}\n\nAnswer with the letter only."


@dataclass
class Question:
    name: str
    kind: str
    instructions: str
    options: list[str]  # the answers' keys: choice names, "yes"/"no", or the legend's indices
    labels: list[str]  # each option's line after its letter


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_value", message)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"{where} must be non-empty text")
    if len(value) > MAX_TEXT_CHARS:
        raise _bad(f"{where} is longer than {MAX_TEXT_CHARS} characters")
    return value


def state_text(state: Any) -> str:
    """The state as the prompt shows it: text as it is; an object as one `name: value` line per
    field (a value that is not text as JSON)."""
    if isinstance(state, str) and state.strip():
        return state
    if isinstance(state, dict) and state:
        return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                         for k, v in state.items())
    raise _bad("state is required: non-empty text, or an object of named values")


def _options(q: dict[str, Any], kind: str, where: str) -> tuple[list[str], list[str]]:
    if kind == "noul":
        return ["yes", "no"], ["Yes", "No"]
    crit = q.get("criteria")
    if kind == "choice" and isinstance(crit, dict):
        names = [str(k) for k in crit]
        labels = [f"{k}: {_text(v, f'{where}.criteria.{k}')}" if v else str(k) for k, v in crit.items()]
    elif isinstance(crit, list):
        labels = [_text(c, f"{where}.criteria[{i}]") for i, c in enumerate(crit)]
        names = labels if kind == "choice" else [str(i) for i in range(len(crit))]
    else:
        shape = "an object {name: description} or a list of names" if kind == "choice" else "a list, in order"
        raise _bad(f"{where}.criteria must be {shape}")
    if not MIN_OPTIONS <= len(names) <= MAX_OPTIONS:
        raise _bad(f"{where} has {len(names)} options: give {MIN_OPTIONS} to {MAX_OPTIONS}")
    if len(set(names)) != len(names):
        raise _bad(f"{where}: two options have the same name")
    return names, labels


def parse_questions(value: Any) -> list[Question]:
    if not isinstance(value, dict) or not value:
        raise _bad("questions is required: an object of named questions")
    if len(value) > MAX_QUESTIONS:
        raise _bad(f"questions has {len(value)} questions: at most {MAX_QUESTIONS}")
    out = []
    for name, q in value.items():
        where = f"questions.{name}"
        if not isinstance(q, dict):
            raise _bad(f"{where} must be an object with type and instructions")
        kind = q.get("type")
        if kind not in KINDS:
            raise _bad(f"{where}.type must be one of {', '.join(KINDS)}; got {kind!r}")
        instructions = _text(q.get("instructions"), f"{where}.instructions")
        options, labels = _options(q, kind, where)
        out.append(Question(name, kind, instructions, options, labels))
    return out


def messages(state: str, q: Question) -> list[dict[str, Any]]:
    lines = "\n".join(f"{string.ascii_uppercase[i]}. {label}" for i, label in enumerate(q.labels))
    return [{"role": "system", "content": SYSTEM.format(state=state)},
            {"role": "user", "content": ASK.format(instructions=q.instructions, options=lines)}]


def letter_tokens(rt: Runtime, n: int) -> list[int]:
    """The token of each of the first n capital letters, as an answer's first token."""
    out = []
    for c in string.ascii_uppercase[:n]:
        ids = rt.tokenizer.encode(c, add_special=False)
        if len(ids) != 1:
            raise _bad(f"this model's vocabulary has no single token for the letter {c}: it cannot be asked "
                       "lettered questions")
        out.append(ids[0])
    return out


def answer(q: Question, logprobs: tuple[float, ...]) -> dict[str, Any]:
    """A question's answer from its letters' log-probabilities."""
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    probs = [w / total for w in weights]
    n = len(probs)
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    confidence = 1.0 - entropy / math.log(n)
    if q.kind == "noul":
        return {"type": "noul", "noul": probs[0]}
    by_name = dict(zip(q.options, probs, strict=True))
    if q.kind == "choice":
        return {"type": "choice", "choice": q.options[probs.index(max(probs))], "probabilities": by_name,
                "confidence": confidence}
    return {"type": "score", "score": sum(i * p for i, p in enumerate(probs)),
            "legend": dict(zip(q.options, q.labels, strict=True)), "probabilities": by_name, "confidence": confidence}


def _doc(d: oa.Doc) -> oa.Op:
    question = oa.obj({"type": oa.enum(*KINDS), "instructions": oa.STR,
                       "criteria": {"anyOf": [{"type": "object"}, oa.arr(oa.STR)]}}, ["type", "instructions"])
    request = oa.obj({"model": d.model_field(),
                      "state": {"anyOf": [oa.STR, {"type": "object"}]},
                      "questions": {"type": "object", "additionalProperties": question}},
                     ["model", "state", "questions"], closed=False)
    answer_shape = oa.obj({"type": oa.enum(*KINDS), "choice": oa.STR, "noul": oa.number(0, 1),
                           "score": oa.number(0, MAX_OPTIONS - 1),
                           "legend": {"type": "object"}, "probabilities": {"type": "object"},
                           "confidence": oa.number(-1e-9, 1 + 1e-9)}, ["type"])
    ok = oa.obj({"model": oa.STR, "answers": {"type": "object", "additionalProperties": answer_shape},
                 "usage": oa.obj({"input_tokens": oa.NAT, "output_tokens": oa.const(0)},
                                 ["input_tokens", "output_tokens"])}, ["model", "answers", "usage"])
    return oa.Op({
        "operationId": "systemone", "summary": "Decisions (Ollama's decision API): probabilities, nothing generated",
        "tags": ["Ollama"],
        "requestBody": oa.body(request, {"model": d.example_model, "state": {"ticket": "I was charged twice."},
                                         "questions": {"refund": {"type": "noul",
                                                                  "instructions": "Is a refund asked for?"}}}),
        "responses": {"200": {"description": "Each question's answer",
                              "headers": {"X-Bubo-Evaluated-Tokens": {
                                  "description": "the prompt positions the model read (the state once)",
                                  "schema": {"type": "integer"}}},
                              "content": {oa.JSON: {"schema": ok}}}},
    }, oa.GEN_ERRORS, ollama=True)


@oa.route(blueprint, "/v1/systemone", methods=("POST",), doc=_doc)
def systemone() -> Any:
    body = json_body()
    model = resolve_model(body)
    state = state_text(body.get("state"))
    questions = parse_questions(body.get("questions"))
    engine = use_model(model)
    rt = runtime_of(engine)
    letters = letter_tokens(rt, max(len(q.options) for q in questions))
    prompts = [pipeline.render_chat(rt, messages(state, q), None, {"enable_thinking": False}, None).tokens
               for q in questions]
    mem = debug_mem_available()

    def submit(i: int) -> Stream:
        req = GenerationRequest(prompts[i], SamplingParams(temperature=0.0), max_tokens=1, draft_max=0,
                                probs_of=tuple(letters[:len(questions[i].options)]))
        return pipeline.submit(engine, req, mem)

    # the first reads the state (its full blocks go to the prefix cache); the others start from them
    outs = [pipeline.collect(submit(0), None)]
    rest: list[Stream] = []
    try:
        for i in range(1, len(questions)):
            rest.append(submit(i))
        outs += [pipeline.collect(s, None) for s in rest]
    finally:
        for s in rest:  # a failure leaves none of them running for nobody (done ones: nothing)
            s.cancel()
    answers = {q.name: answer(q, out.tokens[0].probs_of) for q, out in zip(questions, outs, strict=True)}
    evaluated = sum(out.finished.timings.prompt_n for out in outs)
    resp = jsonify(model=model, answers=answers,
                   usage={"input_tokens": sum(len(p) for p in prompts), "output_tokens": 0})
    resp.headers["X-Bubo-Evaluated-Tokens"] = str(evaluated)
    return resp

