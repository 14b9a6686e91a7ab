"""Stored responses (POST /v1/responses with store, previous_response_id, GET/DELETE
/v1/responses/{id}, .../input_items) on real servers, through the `openai` SDK: each turn continued
from a stored response answers token for token what one request carrying the whole conversation
answers, reads only what its cache does not hold, and the records outlive a restart."""

import json
import threading

import openai
import pytest
from client import call

from .conftest import start_server

pytestmark = pytest.mark.models

QWEN = "qwen2.5-coder:0.5b"
BLOCK = 32  # the KV cache's block: the prefix cache reuses whole blocks
TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
GREEDY = {"temperature": 0}

# (input, request fields, streamed): five turns, a forced call to the tool in the middle and its output
# after it, greedy and seeded
TURNS = [
    ("My name is Ada and I live in Paris. Say hello to me.", {**GREEDY, "max_output_tokens": 16}, False),
    ("What is 12 plus 30? Answer with the number.", {**GREEDY, "max_output_tokens": 12}, True),
    ("What is the weather where I live?", {**GREEDY, "max_output_tokens": 48,
                                           "tool_choice": {"type": "function", "name": "get_weather"}}, False),
    (None, {"temperature": 0.8, "extra_body": {"seed": 7}, "max_output_tokens": 16}, True),  # the call's output
    ("What is my name?", {**GREEDY, "max_output_tokens": 12}, False),
]


def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def create(client, stream, **kw):
    """The response, streamed or not (a stream's last event carries it whole)."""
    if not stream:
        return client.responses.create(model="bubo", **kw)
    events = list(client.responses.create(model="bubo", stream=True, **kw))
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events[-1].response


def said(r):
    """What a response's output says, ids aside."""
    out = []
    for item in r.output:
        if item.type == "message":
            out.append(("message", "".join(p.text for p in item.content)))
        elif item.type == "function_call":
            out.append(("call", item.name, item.arguments))
    return out, r.usage.output_tokens, r.status


def as_input(items):
    return [i.model_dump(exclude_none=True) if hasattr(i, "model_dump") else i for i in items]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("bubo-home")


def test_five_turns_continued_equal_the_whole_conversation_and_outlive_a_restart(home):
    env = {"BUBO_HOME": str(home)}
    history = []  # what a client without stored responses would send: every item so far
    ids, answers = [], []
    with start_server(env=env, model=QWEN, ctx=4096) as s:
        client = sdk(s.wait_ready())
        prev = None
        for i, (text, fields, stream) in enumerate(TURNS):
            new = ([{"type": "function_call_output", "call_id": prev.output[-1].call_id, "output": "sunny, 21 C"}]
                   if text is None else [{"role": "user", "content": text}])
            r = create(client, stream, input=new, tools=TOOLS, previous_response_id=prev.id if prev else None, **fields)
            whole = create(client, stream, input=history + new, tools=TOOLS, store=False, **fields)
            assert said(r) == said(whole), f"turn {i + 1}"
            assert r.previous_response_id == (prev.id if prev else None) and r.store and not whole.store
            if prev is not None:
                # the turns before were not read again: at least every full block of the last prompt was cached
                assert r.usage.input_tokens_details.cached_tokens >= prev.usage.input_tokens // BLOCK * BLOCK > 0
            history += new + as_input(r.output)
            ids.append(r.id)
            answers.append(said(r))
            prev = r
        assert [kind for kind, *_ in answers[2][0]] == ["call"]  # the forced call
        items = client.responses.input_items.list(ids[-1], order="asc", limit=100)
        listed = [i.model_dump(exclude_none=True, warnings=False) for i in items.data]
        assert [i["type"] for i in listed] == [i.get("type", "message") for i in history[:len(listed)]]
        assert len(listed) == len(history) - len(prev.output)

    # a new server on the same $BUBO_HOME: the records are there; a continuation re-reads its prompt
    with start_server(env=env, model=QWEN, ctx=4096) as s:
        client = sdk(s.wait_ready())
        again = client.responses.retrieve(ids[-1])
        assert said(again) == answers[-1] and again.id == ids[-1]
        # any stored turn continues: the third again (its call), with another output
        third = client.responses.retrieve(ids[2])
        upto = [i for i in history]  # history up to the third turn's output
        cut = upto.index(next(i for i in upto if i.get("type") == "function_call")) + 1
        new = [{"type": "function_call_output", "call_id": third.output[-1].call_id, "output": "raining, 9 C"}]
        r = create(client, False, input=new, tools=TOOLS, previous_response_id=third.id, **GREEDY,
                   max_output_tokens=12)
        whole = create(client, False, input=upto[:cut] + new, tools=TOOLS, store=False, **GREEDY,
                       max_output_tokens=12)
        assert said(r) == said(whole)
        assert r.usage.input_tokens_details.cached_tokens == 0  # nothing cached after the restart: read again
        assert whole.usage.input_tokens_details.cached_tokens > 0


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """smollm2 with two slots, at most 3 stored responses, its own $BUBO_HOME."""
    home = tmp_path_factory.mktemp("bubo-home-small")
    with start_server("-np", "2", "--responses-max", "3", env={"BUBO_HOME": str(home)}) as s:
        yield s.wait_ready()


def test_store_false_instructions_and_the_least_recently_used(small):
    client = sdk(small)
    r = client.responses.create(model="bubo", input="Hi.", store=False, max_output_tokens=2, **GREEDY)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)

    a = client.responses.create(model="bubo", input="My name is Ada.", instructions="Answer in one word.",
                                max_output_tokens=4, **GREEDY)
    # instructions are not carried over: the continuation answers as the conversation without them
    b = client.responses.create(model="bubo", input="Who am I?", previous_response_id=a.id, max_output_tokens=8,
                                **GREEDY)
    whole = client.responses.create(model="bubo", input=[{"role": "user", "content": "My name is Ada."},
                                                         *as_input(a.output), {"role": "user", "content": "Who am I?"}],
                                    store=False, max_output_tokens=8, **GREEDY)
    assert b.instructions is None and said(b) == said(whole)
    c = client.responses.create(model="bubo", input="x", max_output_tokens=1, **GREEDY)
    client.responses.retrieve(a.id)  # a is now the most recently used: b goes first
    d = client.responses.create(model="bubo", input="y", max_output_tokens=1, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(b.id)
    for kept in (a, c, d):
        assert client.responses.retrieve(kept.id).id == kept.id

    client.responses.delete(d.id)
    for gone in (lambda: client.responses.retrieve(d.id), lambda: client.responses.delete(d.id),
                 lambda: client.responses.create(model="bubo", input="z", previous_response_id=d.id),
                 lambda: client.responses.input_items.list(d.id)):
        with pytest.raises(openai.NotFoundError) as e:
            gone()
        assert e.value.code == "response_not_found"


def test_input_items_pages_and_bad_requests(small):
    client = sdk(small)
    a = client.responses.create(model="bubo", input=[{"role": "user", "content": "One."},
                                                     {"role": "assistant", "content": "Two."},
                                                     {"role": "user", "content": "Three?"}],
                                max_output_tokens=2, **GREEDY)
    b = client.responses.create(model="bubo", input="Four?", previous_response_id=a.id, max_output_tokens=2,
                                **GREEDY)
    # b's conversation: a's three items, a's output, b's input; newest first by default
    everything = client.responses.input_items.list(b.id, limit=100).data
    assert len(everything) == 5 and everything[0].content[0].text == "Four?"
    assert everything[-1].content[0].text == "One." and len({i.id for i in everything}) == 5
    page, seen = client.responses.input_items.list(b.id, limit=2, order="asc"), []
    for item in page:  # the SDK follows `after` through every page
        seen.append(item.id)
    assert seen == [i.id for i in reversed(everything)]

    for query in ("limit=0", "limit=101", "limit=x", "order=up", "after=msg_nope"):
        status, _, body = call(f"{small.url}/v1/responses/{b.id}/input_items?{query}", "GET")
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_value", query
    for bad in (5, "", ["resp_x"]):
        status, _, body = call(small.url + "/v1/responses", "POST",
                               {"model": "bubo", "input": "x", "previous_response_id": bad})
        assert status == 400 and "previous_response_id" in json.loads(body)["error"]["message"], bad
    status, _, body = call(small.url + "/v1/responses", "POST",
                           {"model": "bubo", "input": "x", "previous_response_id": "resp_nope"})
    assert status == 404 and json.loads(body)["error"]["type"] == "invalid_request_error"


def test_concurrent_continuations_of_one_response_each_get_their_own(small):
    client = sdk(small)
    root = client.responses.create(model="bubo", input="Let us count animals. Name one.", max_output_tokens=6,
                                   **GREEDY)
    asks = ["Name a bird.", "Name a fish."]
    got: dict[str, object] = {}

    def go(ask):
        got[ask] = client.responses.create(model="bubo", input=ask, previous_response_id=root.id,
                                           max_output_tokens=8, **GREEDY)

    threads = [threading.Thread(target=go, args=(a,)) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[asks[0]].id != got[asks[1]].id
    for ask in asks:
        whole = client.responses.create(model="bubo", input=[{"role": "user", "content": "Let us count animals. "
                                                                                          "Name one."},
                                                             *as_input(root.output), {"role": "user", "content": ask}],
                                        store=False, max_output_tokens=8, **GREEDY)
        assert said(got[ask]) == said(whole), ask
        assert client.responses.retrieve(got[ask].id).previous_response_id == root.id


def test_a_home_that_cannot_be_written_keeps_responses_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with start_server(env={"BUBO_HOME": str(blocker / "home")}) as s:
        client = sdk(s.wait_ready())
        status, _, body = call(s.url + "/health", "GET")
        assert status == 200 and "memory" in json.loads(body)["details"]["responses_store"]
        a = client.responses.create(model="bubo", input="Hi.", max_output_tokens=2, **GREEDY)
        b = client.responses.create(model="bubo", input="Again.", previous_response_id=a.id, max_output_tokens=2,
                                    **GREEDY)
        assert client.responses.retrieve(b.id).previous_response_id == a.id
    assert any("responses store" in line and "memory" in line for line in s.log)
