"""POST /v1/systemone (Ollama's decision API) on the real server (smollm2:135m): each answer is
the model's next-token probabilities over its options' letters, renormalised, equal to what
/completion's n_probs says for the same prompt; the state is read once for all the questions;
bad questions are 400s in Ollama's shape, naming the question."""

import json
import math

import pytest
from client import call, call_json

from bubo.api import decision

pytestmark = pytest.mark.models

BLOCK = 32
STATE = {"ticket": " ".join(["I was charged twice for my order of three blue chairs last Tuesday, and the bank shows "
                             "both payments as settled."] * 8) + " Please refund the extra payment.",
         "customer": "Ada, a customer since 2019"}
QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {"billing": "Payments and refunds", "technical": "Bugs and integrations",
                          "other": "None of the above"}},
    "refund": {"type": "noul", "instructions": "Does the customer explicitly ask for a refund?"},
    "urgency": {"type": "score", "instructions": "How urgent is this ticket?",
                "criteria": ["Routine", "Soon", "Urgent"]},
    "tone": {"type": "choice", "instructions": "What is the customer's tone?", "criteria": ["calm", "angry"]},
}


def letters_logprobs(base_url, messages, n):
    """The first n letters' log-probabilities as the next token of the chat, from /completion's n_probs."""
    status, tmpl = call_json(base_url + "/apply-template", "POST", {"messages": messages})
    assert status == 200
    status, out = call_json(base_url + "/completion", "POST", {"prompt": tmpl["prompt"], "n_probs": 100, "n_predict": 1,
                                                              "temperature": 0, "cache_prompt": False})
    assert status == 200
    top = {t["token"]: t["logprob"] for t in out["completion_probabilities"][0]["top_logprobs"]}
    status, toks = call_json(base_url + "/tokenize", "POST", {"content": tmpl["prompt"]})
    return [top["ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i]] for i in range(n)], toks["tokens"]


def test_answers_are_the_next_token_probabilities_and_the_state_is_read_once(base_url):
    status, headers, raw = call(base_url + "/v1/systemone", "POST",
                                {"model": "bubo", "state": STATE, "questions": QUESTIONS})
    assert status == 200, raw
    got = json.loads(raw)
    assert got["usage"]["output_tokens"] == 0 and set(got["answers"]) == set(QUESTIONS)
    state = decision.state_text(STATE)
    prompts = []
    for q in decision.parse_questions(QUESTIONS):
        lps, tokens = letters_logprobs(base_url, decision.messages(state, q), len(q.options))
        prompts.append(tokens)
        weights = [math.exp(lp) for lp in lps]
        want = [w / sum(weights) for w in weights]
        ans = got["answers"][q.name]
        assert ans["type"] == q.kind
        if q.kind == "noul":
            assert ans["noul"] == pytest.approx(want[0], abs=1e-6)
            continue
        assert list(ans["probabilities"].values()) == pytest.approx(want, abs=1e-6)
        entropy = -sum(p * math.log(p) for p in want)
        assert ans["confidence"] == pytest.approx(1 - entropy / math.log(len(want)), abs=1e-6)
        if q.kind == "choice":
            assert ans["choice"] == q.options[want.index(max(want))]
        else:
            assert list(ans["legend"].values()) == ["Routine", "Soon", "Urgent"]
            assert ans["score"] == pytest.approx(sum(i * p for i, p in enumerate(want)), abs=1e-6)

    assert got["usage"]["input_tokens"] == sum(len(p) for p in prompts)
    # the state once: the first question reads its whole prompt, each other one only what follows
    # the full blocks it shares with the first
    def shared(a, b):
        n = 0
        while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
            n += 1
        return n // BLOCK * BLOCK
    once = len(prompts[0]) + sum(len(p) - shared(prompts[0], p) for p in prompts[1:])
    evaluated = int(headers["X-Bubo-Evaluated-Tokens"])
    assert evaluated <= once < got["usage"]["input_tokens"] - 3 * 200  # the state is over 200 tokens


@pytest.mark.parametrize("questions,named", [
    ({"q": {"type": "choice", "instructions": "Pick.", "criteria": ["only"]}}, "questions.q has 1 options"),
    ({"q": {"type": "score", "instructions": "Rate.", "criteria": [str(i) for i in range(27)]}}, "questions.q has 27"),
    ({"q": {"type": "guess", "instructions": "Guess."}}, "questions.q.type"),
    ({"q": {"type": "noul"}}, "questions.q.instructions"),
    ({"q": {"type": "score", "instructions": "Rate.", "criteria": {"a": "b"}}}, "questions.q.criteria"),
    ({"q": {"type": "choice", "instructions": "Pick.", "criteria": ["x", "x"]}}, "same name"),
    ({"q": {"type": "choice", "instructions": "Pick.", "criteria": [1, 2]}}, "questions.q.criteria[0]"),
    ({}, "questions is required"),
    ([1], "questions is required"),
])
def test_a_bad_question_is_a_400_naming_it(base_url, questions, named):
    status, body = call_json(base_url + "/v1/systemone", "POST",
                             {"model": "bubo", "state": "x", "questions": questions})
    assert status == 400 and named in body["error"] and set(body) == {"error"}


def test_a_missing_state_or_model_is_a_400(base_url):
    q = {"q": {"type": "noul", "instructions": "Yes?"}}
    for body in ({"model": "bubo", "questions": q}, {"model": "bubo", "state": {}, "questions": q},
                 {"state": "x", "questions": q}):
        status, out = call_json(base_url + "/v1/systemone", "POST", body)
        assert status == 400 and isinstance(out["error"], str)
