"""Contexts (/v1/contexts, bubo/engine/contexts.py) on a real server (smollm2:135m, 8 slots): a
1,000-token context forked 8 times in well under a millisecond, whose children answer what 8
requests with the whole prompt answer while the KV cache grows by their own tokens only; a
snapshot frees the memory and the next use reads it back; a context in use is a 409, an unknown
one a 404."""

import json
import threading
import urllib.request

import pytest
from client import call_json

from .conftest import start_server

pytestmark = pytest.mark.models

BLOCK = 32
N_CONTEXT = 1000
STORY = " ".join(f"Line {i}: the river ferryman works near the old mill and sells bread to travellers."
                 for i in range(60))
ENDINGS = [" The ferryman", " The mill", " Travellers", " Bread", " The river", " Line 61:", " At night",
           " Nobody"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    home = tmp_path_factory.mktemp("bubo-home-contexts")
    with start_server("-np", "8", "--debug-hooks", ctx=4096, env={"BUBO_HOME": str(home)}) as s:
        yield s.wait_ready()


def post(srv, path, body=None):
    return call_json(srv.url + path, "POST", body if body is not None else {})


def used_blocks(srv):
    return call_json(srv.url + "/debug/cache")[1]["used_blocks"]


def tokens(srv, text, special=False):
    return post(srv, "/tokenize", {"content": text, "add_special": special})[1]["tokens"]


def test_eight_forks_answer_as_eight_whole_prompts_and_hold_only_their_own_tokens(srv):
    prompt = tokens(srv, STORY, special=True)[:N_CONTEXT]
    status, ctx = post(srv, "/v1/contexts", {"prompt": prompt})
    assert status == 200 and ctx["tokens"] == N_CONTEXT and ctx["pages"] == -(-N_CONTEXT // BLOCK), ctx
    before = used_blocks(srv)
    status, forks = post(srv, f"/v1/contexts/{ctx['id']}/fork?n=8")
    assert status == 200 and len(forks["data"]) == 8 and forks["fork_ms"] < 1.0, forks
    assert all(c["parent"] == ctx["id"] and c["shared_pages"] == c["pages"] == ctx["pages"] for c in forks["data"])
    assert used_blocks(srv) == before  # forks share every block

    answers: dict[int, dict] = {}

    def go(i):
        answers[i] = post(srv, "/v1/completions", {"model": "bubo", "prompt": ENDINGS[i], "max_tokens": 8,
                                                   "temperature": 0, "context_id": forks["data"][i]["id"],
                                                   "save": True})[1]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    grown = used_blocks(srv) - before
    own = 0
    for i, child in enumerate(forks["data"]):
        out = answers[i]
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == N_CONTEXT, out  # not read again
        # the whole prompt as one request (its full blocks from the prefix cache: the engine's
        # decode is batch-invariant, so cached rows are the rows it would compute)
        whole = post(srv, "/v1/completions", {"model": "bubo", "prompt": prompt + tokens(srv, ENDINGS[i]),
                                              "max_tokens": 8, "temperature": 0})[1]
        assert out["choices"][0]["text"] == whole["choices"][0]["text"], i
        status, now = call_json(srv.url + f"/v1/contexts/{child['id']}")
        assert now["tokens"] > N_CONTEXT and now["shared_pages"] == N_CONTEXT // BLOCK
        own += now["pages"] - now["shared_pages"]  # its own blocks: the shared last one copied, and on
    # the cache grew by the children's own blocks only (8 whole copies would be 8 x 32 blocks)
    assert grown == own and own <= 8 * 2


def test_a_snapshot_frees_the_memory_and_the_next_use_reads_it_back(srv):
    status, ctx = post(srv, "/v1/contexts", {"messages": [{"role": "user", "content": "Name three colors."}]})
    assert status == 200 and ctx["tokens"] > 0
    first = post(srv, "/completion", {"prompt": "", "context_id": ctx["id"], "n_predict": 8, "temperature": 0})[1]
    before = used_blocks(srv)
    status, snap = post(srv, f"/v1/contexts/{ctx['id']}/snapshot")
    assert status == 200 and snap["spilled"] and snap["pages"] == 0 and used_blocks(srv) < before
    again = post(srv, "/completion", {"prompt": "", "context_id": ctx["id"], "n_predict": 8, "temperature": 0})[1]
    # all of it from the file but the last token, which runs again: its logits start the answer
    assert again["content"] == first["content"] and again["timings"]["cache_n"] == ctx["tokens"] - 1
    status, back = call_json(srv.url + f"/v1/contexts/{ctx['id']}")
    assert not back["spilled"] and back["pages"] > 0
    listed = call_json(srv.url + "/v1/contexts")[1]
    assert listed["object"] == "list" and ctx["id"] in [c["id"] for c in listed["data"]]
    assert call_json(srv.url + f"/v1/contexts/{ctx['id']}", "DELETE")[1]["deleted"] is True


def test_a_context_in_use_is_a_409_and_an_unknown_one_a_404(srv):
    status, ctx = post(srv, "/v1/contexts", {"prompt": STORY[:400]})
    assert status == 200
    # a streamed answer that moves the context forward: the context is in use until it ends
    req = urllib.request.Request(srv.url + "/completion", json.dumps(
        {"prompt": " And", "context_id": ctx["id"], "save": True, "n_predict": 400, "ignore_eos": True,
         "stream": True}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as stream:
        stream.readline()  # it has started
        for path in (f"/v1/contexts/{ctx['id']}/fork", f"/v1/contexts/{ctx['id']}/snapshot"):
            status, out = post(srv, path)
            assert status == 409 and out["error"]["code"] == "context_busy", (path, out)
        status, out = post(srv, "/completion", {"prompt": "x", "context_id": ctx["id"], "save": True, "n_predict": 1})
        assert status == 409
    # the reader went away: the request ends and the context is free again
    for _ in range(100):
        status, out = post(srv, f"/v1/contexts/{ctx['id']}/fork")
        if status == 200:
            break
    assert status == 200, out

    gone = "ctx_000000000000000000000000"
    for method, path, body in (("GET", f"/v1/contexts/{gone}", None), ("DELETE", f"/v1/contexts/{gone}", None),
                               ("POST", f"/v1/contexts/{gone}/fork", {}), ("POST", f"/v1/contexts/{gone}/snapshot", {}),
                               ("POST", "/v1/completions", {"model": "bubo", "prompt": "x", "context_id": gone})):
        status, out = call_json(srv.url + path, method, body)
        assert status == 404 and out["error"]["code"] == "context_not_found", (path, out)
    for bad in ("n=0", "n=65", "n=x"):
        status, out = post(srv, f"/v1/contexts/{ctx['id']}/fork?{bad}")
        assert status == 400, bad
    status, out = post(srv, "/v1/completions", {"model": "bubo", "prompt": "x", "context_id": 5})
    assert status == 400


def test_chat_routes_continue_a_context_made_from_the_first_messages(srv):
    first = [{"role": "user", "content": "My name is Ada and I live in Paris. Say hello to me."}]
    status, ctx = post(srv, "/v1/contexts", {"messages": first})
    assert status == 200
    chat = {"model": "bubo", "max_tokens": 12, "temperature": 0}
    plain = post(srv, "/v1/chat/completions", {**chat, "messages": first, "cache_prompt": False})[1]
    # the conversation so far is the context: all of it from the context but the last token
    status, got = post(srv, "/v1/chat/completions", {**chat, "messages": first, "context_id": ctx["id"],
                                                      "save": True})
    assert status == 200 and got["choices"][0]["message"] == plain["choices"][0]["message"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == ctx["tokens"] - 1
    moved = call_json(srv.url + f"/v1/contexts/{ctx['id']}")[1]
    assert moved["tokens"] > ctx["tokens"]  # save: the context ends where this answer ends
    # the next turn: the context serves the part of the rendered conversation it agrees with
    turn2 = first + [got["choices"][0]["message"], {"role": "user", "content": "Where do I live?"}]
    plain2 = post(srv, "/v1/chat/completions", {**chat, "messages": turn2, "cache_prompt": False})[1]
    got2 = post(srv, "/v1/chat/completions", {**chat, "messages": turn2, "context_id": ctx["id"]})[1]
    assert got2["choices"][0]["message"] == plain2["choices"][0]["message"]
    assert got2["usage"]["prompt_tokens_details"]["cached_tokens"] >= ctx["tokens"]
    for path, body in (("/v1/responses", {"model": "bubo", "input": first[0]["content"], "max_output_tokens": 4}),
                       ("/v1/messages", {"model": "bubo", "max_tokens": 4, "messages": first})):
        status, out = post(srv, path, {**body, "context_id": ctx["id"]})
        assert status == 200, (path, out)
    status, out = post(srv, "/v1/chat/completions", {**chat, "messages": first, "context_id": "ctx_nope"})
    assert status == 404


def test_a_context_made_twice_from_a_cached_prompt_and_a_refused_save_leave_no_trace(srv):
    # 33 tokens of a repeating text: made again, all but its last token come from the prefix cache,
    # so one token is left to read (where a generating request would draft from the repetition)
    ids = (tokens(srv, " one two three four", special=True) * 20)[:33]
    made = [post(srv, "/v1/contexts", {"prompt": ids}) for _ in range(2)]
    assert [status for status, _ in made] == [200, 200] and made[1][1]["tokens"] == 33
    ctx = made[1][1]
    # a request with save that is refused (a grammar that does not parse) gives the context back
    status, out = post(srv, "/v1/completions", {"model": "bubo", "prompt": " five", "context_id": ctx["id"],
                                                "save": True, "grammar": "root ::= (", "max_tokens": 2})
    assert status == 400, out
    status, out = post(srv, f"/v1/contexts/{ctx['id']}/fork")
    assert status == 200, out
    status, out = post(srv, "/v1/completions", {"model": "bubo", "prompt": " five", "context_id": ctx["id"],
                                                "save": True, "max_tokens": 2, "temperature": 0})
    assert status == 200 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 33
