"""Bad tools are a 400 that names the tool, in every dialect: a tool without a name, two tools
with one name, parameters that are not the schema of an object."""

from __future__ import annotations

import pytest
from client import call_json

pytestmark = pytest.mark.models

OBJ = {"type": "object", "properties": {"city": {"type": "string"}}}


def post(url: str, body: dict) -> tuple[int, dict]:
    return call_json(url, "POST", body, timeout=60)

def bodies(tools: list[dict]) -> list[tuple[str, dict]]:
    """One request per dialect with these tools ({"name", "parameters"} each, None: left out)."""
    def fn(t):
        return {k: v for k, v in {"name": t["name"], "parameters": t["parameters"]}.items() if v is not None}

    chat = [{"type": "function", "function": fn(t)} for t in tools]
    responses = [{"type": "function", **fn(t)} for t in tools]
    anthropic = [{k: v for k, v in {"name": t["name"], "input_schema": t["parameters"]}.items() if v is not None}
                 for t in tools]
    ask = [{"role": "user", "content": "hi"}]
    return [("/v1/chat/completions", {"model": "bubo", "messages": ask, "tools": chat, "max_tokens": 4}),
            ("/v1/responses", {"model": "bubo", "input": "hi", "tools": responses, "max_output_tokens": 4}),
            ("/v1/messages", {"model": "bubo", "messages": ask, "tools": anthropic, "max_tokens": 4})]


@pytest.mark.parametrize("tools,says", [
    ([{"name": "ok", "parameters": OBJ}, {"name": None, "parameters": OBJ}], "tools[1] has no name"),
    ([{"name": "", "parameters": OBJ}], "tools[0] has no name"),
    ([{"name": "w", "parameters": OBJ}, {"name": "w", "parameters": OBJ}], "tools[1] is named 'w', as tools[0] is"),
    ([{"name": "w", "parameters": "city: string"}], "tools[0] ('w')"),
    ([{"name": "w", "parameters": [OBJ]}], "tools[0] ('w')"),
    ([{"name": "w", "parameters": {"type": "string"}}], "tools[0] ('w')"),
])
def test_bad_tools_are_a_400_naming_the_tool(base_url, tools, says):
    for path, body in bodies(tools):
        status, answer = post(base_url + path, body)
        assert status == 400, (path, answer)
        message = answer["error"]["message"]
        assert says in message, (path, message)


def test_good_tools_still_work(base_url):
    tools = [{"name": "w", "parameters": OBJ}, {"name": "x", "parameters": None},
             {"name": "y", "parameters": {"type": ["object", "null"], "properties": {}}}]
    for path, body in bodies(tools):
        status, answer = post(base_url + path, body)
        assert status == 200, (path, answer)
