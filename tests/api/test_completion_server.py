"""llama-server's POST /completion on the real server (smollm2:135m), plain HTTP."""

import json
import re
import urllib.request

import pytest
from client import call, call_json

pytestmark = pytest.mark.models

PROMPT = "The capital of France is"


def post(base_url, body, stream=False):
    status, _, data = call(base_url + "/completion", "POST", body)
    assert status == 200, data[:500]
    raw = data.decode()
    if not stream:
        return json.loads(raw)
    return [json.loads(line[len("data: "):]) for line in raw.split("\n\n") if line.startswith("data: ")]

def test_completion_shape_and_stream(base_url):
    r = post(base_url, {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True})
    assert r["stop"] is True and r["stop_type"] in ("eos", "limit") and r["content"]
    assert r["tokens_predicted"] == len(r["tokens"]) <= 8
    assert r["tokens_evaluated"] > 0 and r["timings"]["predicted_n"] == r["tokens_predicted"]
    assert r["model"] == "smollm2:135m" and r["generation_settings"]["n_predict"] == 8
    chunks = post(base_url, {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stream": True,
                             "return_tokens": True}, stream=True)
    assert "".join(c["content"] for c in chunks) == r["content"]
    assert [t for c in chunks for t in c["tokens"]] == r["tokens"]
    assert chunks[-1]["stop"] is True and all(c["stop"] is False for c in chunks[:-1])
    assert chunks[-1]["stop_type"] == r["stop_type"]


def test_completion_token_prompt_probs_and_stop_word(base_url):
    tok = json.loads(urllib.request.urlopen(urllib.request.Request(
        base_url + "/tokenize", data=json.dumps({"content": PROMPT}).encode(),
        headers={"Content-Type": "application/json"}), timeout=30).read())["tokens"]
    by_text = post(base_url, {"prompt": PROMPT, "n_predict": 6, "temperature": 0})
    by_ids = post(base_url, {"prompt": tok, "n_predict": 6, "temperature": 0, "n_probs": 3})
    assert by_ids["content"] == by_text["content"]
    probs = by_ids["completion_probabilities"]
    assert len(probs) == by_ids["tokens_predicted"]
    assert all(len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"] for p in probs)
    assert "".join(p["token"] for p in probs) == by_ids["content"]
    word = by_text["content"].split()[0]
    cut = post(base_url, {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stop": [word]})
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word and word not in cut["content"]


def post_path(base_url, path, body):
    return call_json(base_url + path, "POST", body)


def post_status(base_url, body):
    return post_path(base_url, "/completion", body)


def test_completion_grammar_constrains_the_answer(base_url):
    grammar = 'root ::= city ", " city\ncity ::= [A-Z] [a-z]{2,9}'
    for stream in (False, True):
        r = post(base_url, {"prompt": "Two cities in Europe:", "n_predict": 24, "temperature": 0.9, "seed": 3,
                            "grammar": grammar, "stream": stream}, stream=stream)
        text = "".join(c["content"] for c in r) if stream else r["content"]
        last = r[-1] if stream else r
        assert re.fullmatch(r"[A-Z][a-z]{2,9}, [A-Z][a-z]{2,9}", text), text
        assert last["stop_type"] == "eos"


@pytest.mark.parametrize("body,code,where", [
    ({"grammar": 'root ::= "a'}, "invalid_grammar", "line 1"),
    ({"grammar": "root ::= item\n"}, "invalid_grammar", "item"),
    ({"grammar": 42}, "invalid_value", "grammar"),
    ({"json_schema": {"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 5}}}},
     "unsupported_schema", "/properties/age/multipleOf"),
    ({"json_schema": "object"}, "invalid_value", "json_schema must be a JSON Schema"),
    ({"json_schema": {"type": "strin"}}, "unsupported_schema", "/type"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "invalid_value", "not both"),
    ({"response_format": {"type": "json_object"}, "json_schema": {}}, "invalid_value", "not both"),
    ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "invalid_value", "not both"),
])
def test_completion_grammar_errors_point_at_the_problem(base_url, body, code, where):
    status, err = post_status(base_url, {"prompt": "Hi", "n_predict": 4, **body})
    assert status == 400 and err["error"]["code"] == code and where in err["error"]["message"], err


def test_openai_routes_take_grammar_too(base_url):
    grammar = 'root ::= ("red" | "green" | "blue") "."'
    status, out = post_path(base_url, "/v1/chat/completions", {
        "model": "bubo", "messages": [{"role": "user", "content": "Pick a colour."}], "max_tokens": 8,
        "grammar": grammar})
    assert status == 200 and out["choices"][0]["message"]["content"] in ("red.", "green.", "blue.")
    assert out["choices"][0]["finish_reason"] == "stop"
    status, out = post_path(base_url, "/v1/completions", {"model": "bubo", "prompt": "Colour:", "max_tokens": 8,
                                                          "grammar": grammar})
    assert status == 200 and out["choices"][0]["text"] in ("red.", "green.", "blue.")
    status, err = post_path(base_url, "/v1/completions", {"model": "bubo", "prompt": "Colour:", "grammar": grammar,
                                                          "response_format": {"type": "json_object"}})
    assert status == 400 and "not both" in err["error"]["message"], err
