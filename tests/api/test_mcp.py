"""The Model Context Protocol at /mcp (bubo.api.mcp), driven by the official `mcp` SDK's client
(streamable_http_client + ClientSession): it initialises, lists and calls every tool (each answer
the route's own: chat greedy equals /v1/chat/completions greedy), streams a call's progress, lists
and reads resources, with and without a key (a caller sees only its own); and raw JSON-RPC that is
malformed, an unknown method or tool, or bad arguments gets the error the specification names,
never a 500."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import pytest
from client import call

from .conftest import MODEL, Server, start_server

pytestmark = pytest.mark.models

EMBEDDER = "all-minilm:l6-v2"
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
CHAT = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def open_srv(minilm_gguf, tmp_path_factory):
    """No keys; a chat model (the default) and an embedding model (router mode)."""
    home = tmp_path_factory.mktemp("home")
    with Server("-m", MODEL, "-m", EMBEDDER, "-np", "2", model=None, env={"BUBO_HOME": str(home)}) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def keyed_srv(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    keys = home / "keys"
    keys.write_text(f"alice {ALICE}\nbob {BOB}\n")
    with start_server("--api-key-file", str(keys), env={"BUBO_HOME": str(home)}) as s:
        yield s.wait_ready({"Authorization": f"Bearer {ALICE}"})


def _post(server, path: str, body: Any, key: str | None = None, headers: dict[str, str] | None = None):
    hdrs = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    status, out_headers, data = call(server.url + path, "POST", body, headers=hdrs)
    return status, out_headers, json.loads(data) if data else None


def _field(obj: Any, snake: str, camel: str) -> Any:
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


async def _session(stack: AsyncExitStack, url: str, key: str | None):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)))
    streams = await stack.enter_async_context(streamable_http_client(url + "/mcp", http_client=http))
    session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
    init = await session.initialize()
    return session, init


def _text(result: Any) -> dict[str, Any]:
    assert not _field(result, "is_error", "isError"), result
    doc = json.loads(result.content[0].text)
    assert _field(result, "structured_content", "structuredContent") == doc
    return doc


def test_the_sdk_calls_every_tool_and_each_answers_as_its_route(open_srv):
    # the embedding model loaded (router mode loads on request): embed is listed once it is known
    status, _, direct_embed = _post(open_srv, "/v1/embeddings", {"model": EMBEDDER, "input": ["a cat", "a dog"]})
    assert status == 200, direct_embed
    direct_chat = _post(open_srv, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 16,
                                                           "temperature": 0})[2]
    direct_text = _post(open_srv, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 8,
                                                      "temperature": 0})[2]
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
              "additionalProperties": False}
    progress: list[float] = []

    async def run() -> None:
        async with AsyncExitStack() as stack:
            session, init = await _session(stack, open_srv.url, None)
            assert _field(init, "protocol_version", "protocolVersion") == "2025-11-25"
            assert _field(init, "server_info", "serverInfo").name == "bubo"
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert sorted(tools) == ["chat", "complete", "embed", "list_models"]
            assert all(_field(t, "input_schema", "inputSchema")["type"] == "object" for t in tools.values())

            chat = _text(await session.call_tool("chat", {"messages": CHAT, "max_tokens": 16, "temperature": 0}))
            assert chat["choices"][0]["message"] == direct_chat["choices"][0]["message"]
            text = _text(await session.call_tool("complete", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}))
            assert text["choices"][0]["text"] == direct_text["choices"][0]["text"]
            vectors = _text(await session.call_tool("embed", {"model": EMBEDDER, "input": ["a cat", "a dog"]}))
            assert [d["embedding"] for d in vectors["data"]] == [d["embedding"] for d in direct_embed["data"]]
            listed = _text(await session.call_tool("list_models", {}))
            assert {m["id"] for m in listed["data"]} >= {MODEL, EMBEDDER}
            shaped = _text(await session.call_tool("chat", {"messages": CHAT, "max_tokens": 40, "temperature": 0,
                                                            "json_schema": schema}))
            answer = json.loads(shaped["choices"][0]["message"]["content"])
            assert list(answer) == ["colour"] and isinstance(answer["colour"], str)

            # a streamed call: progress as the answer grows, then the same answer
            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append(done)
            long = {"prompt": PROMPT, "max_tokens": 120, "temperature": 0}
            streamed = _text(await session.call_tool("complete", long, progress_callback=on_progress))
            direct_long = _post(open_srv, "/v1/completions", {"model": MODEL, **long})[2]
            assert streamed["choices"][0]["text"] == direct_long["choices"][0]["text"]

            # a route's refusal is the tool's error result
            refused = await session.call_tool("chat", {"messages": CHAT, "model": "no-such-model"})
            assert _field(refused, "is_error", "isError")
            assert json.loads(refused.content[0].text)["error"]["code"] == "model_not_found"
    asyncio.run(run())
    assert progress[0] == 0 and progress == sorted(progress) and progress[-1] <= 120, progress


def test_resources_are_the_callers_own_contexts_and_responses(keyed_srv):
    from mcp.shared.exceptions import MCPError

    status, _, ctx = _post(keyed_srv, "/v1/contexts", {"prompt": PROMPT}, ALICE)
    assert status == 200, ctx
    status, _, resp = _post(keyed_srv, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2},
                            ALICE)
    assert status == 200, resp
    mine = {f"bubo://contexts/{ctx['id']}", f"bubo://responses/{resp['id']}"}

    async def run() -> None:
        async with AsyncExitStack() as stack:
            alice, _ = await _session(stack, keyed_srv.url, ALICE)
            listed = {str(r.uri) for r in (await alice.list_resources()).resources}
            assert mine <= listed
            templates = (await alice.list_resource_templates())
            assert {_field(t, "uri_template", "uriTemplate") for t in _field(templates, "resource_templates",
                                                                             "resourceTemplates")} == \
                {"bubo://contexts/{id}", "bubo://responses/{id}"}
            for uri, path in ((f"bubo://contexts/{ctx['id']}", f"/v1/contexts/{ctx['id']}"),
                              (f"bubo://responses/{resp['id']}", f"/v1/responses/{resp['id']}")):
                read = await alice.read_resource(uri)
                got = json.loads(read.contents[0].text)
                status, _, data = call(keyed_srv.url + path, headers={"Authorization": f"Bearer {ALICE}"})
                assert status == 200 and got == json.loads(data)

            bob, _ = await _session(stack, keyed_srv.url, BOB)
            assert not mine & {str(r.uri) for r in (await bob.list_resources()).resources}
            for uri in mine:
                with pytest.raises(MCPError) as e:
                    await bob.read_resource(uri)
                assert e.value.error.code == -32002
            chat = _text(await bob.call_tool("chat", {"messages": CHAT, "max_tokens": 4, "temperature": 0}))
            assert chat["object"] == "chat.completion"

        async with AsyncExitStack() as stack:  # no key: the first request is refused
            with pytest.raises(Exception) as refused:
                await _session(stack, keyed_srv.url, None)
            assert "401" in repr(refused.value) or "API key" in repr(refused.value) or \
                isinstance(refused.value, MCPError)
    asyncio.run(run())
    status, _, out = _post(keyed_srv, "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert status == 401 and out["error"]["code"] == -32600 and out["error"]["data"]["code"] == "invalid_api_key"


def test_sessions_are_their_callers_and_end_with_delete(keyed_srv):
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
           "params": {"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    status, headers, out = _post(keyed_srv, "/mcp", rpc, ALICE)
    assert status == 200 and out["result"]["protocolVersion"] == "2025-11-25"  # unknown: the latest
    sid = headers["Mcp-Session-Id"]
    ping = {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    assert _post(keyed_srv, "/mcp", ping, ALICE, {"Mcp-Session-Id": sid})[2] == {"jsonrpc": "2.0", "id": "p",
                                                                                 "result": {}}
    assert _post(keyed_srv, "/mcp", ping, BOB, {"Mcp-Session-Id": sid})[0] == 404  # not bob's
    # one caller's many sessions end only its own oldest ones
    bobs = [_post(keyed_srv, "/mcp", rpc, BOB)[1]["Mcp-Session-Id"] for _ in range(65)]
    assert _post(keyed_srv, "/mcp", ping, BOB, {"Mcp-Session-Id": bobs[0]})[0] == 404
    assert _post(keyed_srv, "/mcp", ping, BOB, {"Mcp-Session-Id": bobs[-1]})[0] == 200
    assert _post(keyed_srv, "/mcp", ping, ALICE, {"Mcp-Session-Id": sid})[0] == 200
    hdrs = {"Authorization": f"Bearer {ALICE}", "Mcp-Session-Id": sid}
    assert call(keyed_srv.url + "/mcp", "DELETE", headers=hdrs)[0] == 200
    assert call(keyed_srv.url + "/mcp", "DELETE", headers=hdrs)[0] == 404
    assert _post(keyed_srv, "/mcp", ping, ALICE, {"Mcp-Session-Id": sid})[0] == 404
    assert call(keyed_srv.url + "/mcp", "DELETE", headers={"Authorization": f"Bearer {ALICE}"})[0] == 400


MESSAGES_OK = {"messages": CHAT}


@pytest.mark.parametrize("raw, status, code", [
    (b"{not json", 400, -32700),
    (b"[]", 400, -32600),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', 400, -32600),
    (b'"ping"', 400, -32600),
    (b'{"id": 1, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', 400, -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "prompts/list"}', 200, -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "no/such"}', 200, -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nope"}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "chat"}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "chat", "arguments": []}}', 200, -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "bubo://contexts/ctx_x"}}', 200,
     -32002),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "file:///etc/passwd"}}', 200,
     -32002),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}}', 200, -32602),
])
def test_bad_json_rpc_gets_the_specifications_error(open_srv, raw, status, code):
    got, _, data = call(open_srv.url + "/mcp", "POST", raw=raw, headers={"Content-Type": "application/json"})
    out = json.loads(data)
    assert got == status and out["error"]["code"] == code and out["jsonrpc"] == "2.0", out


@pytest.mark.parametrize("args, says", [
    ({"messages": "hi"}, "messages must be an array"),
    ({"messages": []}, "at least 1 item"),
    ({"messages": ["hi"]}, "messages[0] must be an object"),
    ({**MESSAGES_OK, "max_tokens": "8"}, "max_tokens must be an integer"),
    ({**MESSAGES_OK, "max_tokens": 0}, "max_tokens must be at least 1"),
    ({**MESSAGES_OK, "max_tokens": True}, "max_tokens must be an integer"),
    ({**MESSAGES_OK, "temperature": -1}, "temperature must be at least 0"),
    ({**MESSAGES_OK, "json_schema": "x"}, "json_schema must be an object"),
    ({**MESSAGES_OK, "top_k": 3}, "unknown argument 'top_k'"),
])
def test_bad_arguments_are_invalid_params_naming_the_argument(open_srv, args, says):
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "chat", "arguments": args}}
    status, _, out = _post(open_srv, "/mcp", rpc)
    assert status == 200 and out["id"] == 7 and out["error"]["code"] == -32602 and says in out["error"]["message"]


def test_odd_values_never_give_a_500(open_srv):
    for args in ({**MESSAGES_OK, "temperature": 10 ** 400, "max_tokens": 1}, {**MESSAGES_OK, "max_tokens": 10 ** 30}):
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "chat", "arguments": args}}
        status, _, out = _post(open_srv, "/mcp", rpc)
        assert status == 200 and out["result"]["isError"], out  # the route's 400, as the tool's error
    for uri in ("bubo://responses/../models", "bubo://contexts/x?model=y", "bubo://responses/" + "x" * 300):
        rpc = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": uri}}
        status, _, out = _post(open_srv, "/mcp", rpc)
        assert status == 200 and out["error"]["code"] == -32002, out


def test_the_transport_edges(open_srv):
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status, _, data = call(open_srv.url + "/mcp", "POST", note)
    assert status == 202 and data == b""
    status, headers, _ = call(open_srv.url + "/mcp")
    assert status == 405 and headers["Allow"] == "POST, DELETE"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    status, _, out = _post(open_srv, "/mcp", ping, headers={"MCP-Protocol-Version": "1999-01-01"})
    assert status == 400 and out["error"]["code"] == -32600
    status, _, out = _post(open_srv, "/mcp", ping, headers={"Mcp-Session-Id": "0" * 32})
    assert status == 404 and out["error"]["code"] == -32600
    status, _, out = _post(open_srv, "/mcp", ping, headers={"Origin": "https://evil.example"})
    assert status == 403 and out["error"]["data"]["code"] == "forbidden_origin"
    assert _post(open_srv, "/mcp", ping, headers={"Origin": open_srv.url})[0] == 200


def test_no_mcp_turns_it_off():
    with start_server("--no-mcp") as s:
        s.wait_ready()
        status, _, data = call(s.url + "/mcp", "POST", {"jsonrpc": "2.0", "id": 1, "method": "ping"})
        out = json.loads(data)
        assert status == 404 and out["error"]["data"]["code"] == "not_found", out
