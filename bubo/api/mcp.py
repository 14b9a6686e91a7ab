"""The Model Context Protocol (MCP) at /mcp: the Streamable HTTP transport, JSON-RPC 2.0, so
that an MCP host (an editor, a desktop assistant, an agent framework) uses the served models
without learning the routes.

    POST   /mcp    one JSON-RPC message: a request is answered in JSON (application/json), or,
                   for a tools/call with a progressToken from a client that takes
                   text/event-stream, as server-sent events: notifications/progress as the
                   answer's tokens come, then the response. A notification or a response: 202.
    GET    /mcp    405: the server sends nothing unasked (the transport allows that answer)
    DELETE /mcp    ends the session named by Mcp-Session-Id (404 when there is none such)

initialize negotiates the protocol version (the client's when it is one of VERSIONS, else the
latest) and opens a session (Mcp-Session-Id in the answer, to send with every later request); a
request without the header is served too (stateless), one with an unknown or ended session's id
is a 404. A session is its caller's (bubo.api.callers): another caller's key makes it unknown.

Tools, each answering with its route's JSON as text and as structuredContent: chat
(/v1/chat/completions), complete (/v1/completions), embed (/v1/embeddings; listed when an
embedding model is served) and list_models (/v1/models). The call runs the route itself, as the
same caller, so every check, limit and count is the route's. Resources: the caller's contexts
(bubo://contexts/{id}, as GET /v1/contexts/{id} describes one) and stored responses
(bubo://responses/{id}, as GET /v1/responses/{id}). No prompts.

Errors are the specification's: a body that is not JSON -32700 (HTTP 400), a message that is not
JSON-RPC -32600 (400), an unknown method -32601, an unknown tool or arguments its schema refuses
-32602, an unknown resource -32002 (HTTP 200: the request was read). A route's refusal inside a
tool is the tool's result with isError true. Auth, Host and Origin checks are every route's (their
refusals carry a JSON-RPC error body). --no-mcp turns the endpoint off."""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import gevent
from flask import Blueprint, Flask, Response, current_app, request

import bubo
from bubo.api import callers
from bubo.api import openapi as oa
from bubo.api.request import models, response_store
from bubo.api.sse import sse_response

blueprint = Blueprint("mcp", __name__)
log = logging.getLogger("bubo.api")

# the versions an initialize may agree on, oldest first (the official SDK's handshake versions)
VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MAX_SESSIONS = 64  # a caller's open sessions; past it its least recently used one ends
PROGRESS_EVERY_S = 0.1  # how often a streamed call says how far the answer is

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
RESOURCE_NOT_FOUND = -32002
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a context's or a stored response's id


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


# --- sessions ------------------------------------------------------------------------------


class Sessions:
    """Open sessions: id -> (its caller, its protocol version), the least recently used first. A
    caller has at most `limit` (the callers are the key file's: their number is bounded), so that
    one caller's new sessions never end another's."""

    def __init__(self, limit: int = MAX_SESSIONS):
        self.limit = limit
        self._open: OrderedDict[str, tuple[str | None, str]] = OrderedDict()

    def new(self, caller: str | None, version: str) -> str:
        id = uuid.uuid4().hex
        self._open[id] = (caller, version)
        mine = [s for s, (c, _) in self._open.items() if c == caller]
        for old in mine[:max(0, len(mine) - self.limit)]:
            del self._open[old]
        return id

    def known(self, id: str, caller: str | None) -> bool:
        """Whether id is one of caller's open sessions (then the most recently used)."""
        got = self._open.get(id)
        if got is None or got[0] != caller:
            return False
        self._open.move_to_end(id)
        return True

    def end(self, id: str, caller: str | None) -> bool:
        if not self.known(id, caller):
            return False
        del self._open[id]
        return True


def _sessions() -> Sessions:
    found: Sessions = current_app.config.setdefault("BUBO_MCP_SESSIONS", Sessions())
    return found


def _session_known() -> bool:
    """A request's Mcp-Session-Id: none (stateless), or one of its caller's open sessions."""
    sid = request.headers.get("Mcp-Session-Id")
    return sid is None or _sessions().known(sid, callers.caller())


# --- the tools ---------------------------------------------------------------------------------

_MODEL = {"type": "string", "description": "a served model's name (the default model when left out)"}
_MAX = {"type": "integer", "minimum": 1, "description": "most tokens the answer may have"}
_TEMP = {"type": "number", "minimum": 0, "description": "sampling temperature (0: greedy)"}
_MESSAGE = {"type": "object", "properties": {"role": {"type": "string"}, "content": {}}, "required": ["role"]}

TOOLS: dict[str, dict[str, Any]] = {
    "chat": {
        "description": "Answer a conversation with a served model (POST /v1/chat/completions); json_schema "
                       "makes the answer JSON of that schema",
        "inputSchema": {"type": "object", "properties": {
            "messages": {"type": "array", "items": _MESSAGE, "minItems": 1}, "model": _MODEL, "max_tokens": _MAX,
            "temperature": _TEMP, "json_schema": {"type": "object", "description": "a JSON schema for the answer"}},
            "required": ["messages"], "additionalProperties": False},
    },
    "complete": {
        "description": "Continue a text with a served model (POST /v1/completions)",
        "inputSchema": {"type": "object", "properties": {
            "prompt": {"type": "string"}, "model": _MODEL, "max_tokens": _MAX, "temperature": _TEMP},
            "required": ["prompt"], "additionalProperties": False},
    },
    "embed": {
        "description": "Embedding vectors of texts from a served embedding model (POST /v1/embeddings)",
        "inputSchema": {"type": "object", "properties": {
            "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
            "model": _MODEL}, "required": ["input"], "additionalProperties": False},
    },
    "list_models": {
        "description": "The served models (GET /v1/models)",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def _serves_embeddings() -> bool:
    from bubo.embed import is_encoder

    for e in models().entries:
        rt = e.engine.runtime if e.engine is not None else None
        if e.spec.settings.embedding or (rt is not None and is_encoder(rt)):
            return True
    return False


def _tools() -> list[dict[str, Any]]:
    return [{"name": name, **tool} for name, tool in TOOLS.items() if name != "embed" or _serves_embeddings()]


_TYPES: dict[str, Any] = {"string": str, "object": dict, "array": list, "number": (int, float), "integer": int}


def check_arguments(value: Any, schema: dict[str, Any], where: str = "arguments") -> None:
    """value against a tool's input schema (the few keywords TOOLS use); RpcError INVALID_PARAMS
    naming the first argument that does not fit."""
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                check_arguments(value, option, where)
                return
            except RpcError:
                continue
        raise RpcError(INVALID_PARAMS, f"{where} must be a string or an array of strings")
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _TYPES[kind]) or isinstance(value, bool)
                             or (isinstance(value, float) and not math.isfinite(value))):
        raise RpcError(INVALID_PARAMS, f"{where} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}; got "
                                       f"{json.dumps(value)[:80]}")
    if "minimum" in schema and value < schema["minimum"]:
        raise RpcError(INVALID_PARAMS, f"{where} must be at least {schema['minimum']}; got {str(value)[:40]}")
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise RpcError(INVALID_PARAMS, f"{where} must have at least {schema['minItems']} item")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            check_arguments(item, schema["items"], f"{where}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise RpcError(INVALID_PARAMS, f"{where} lacks {name!r}")
        for name, item in value.items():
            if name in props:
                check_arguments(item, props[name], f"{where}.{name}" if where != "arguments" else name)
            elif schema.get("additionalProperties") is False:
                raise RpcError(INVALID_PARAMS, f"unknown argument {name!r}: this tool takes "
                                               f"{', '.join(props) or 'none'}")


def _route_call(name: str, args: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, body) of the route a tool call runs."""
    model = args.get("model") or models().default.name
    knobs: dict[str, Any] = {k: args[k] for k in ("max_tokens", "temperature") if k in args}
    if name == "chat":
        body: dict[str, Any] = {"model": model, "messages": args["messages"], **knobs}
        if "json_schema" in args:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": args["json_schema"]}}
        return "POST", "/v1/chat/completions", body
    if name == "complete":
        return "POST", "/v1/completions", {"model": model, "prompt": args["prompt"], **knobs}
    if name == "embed":
        return "POST", "/v1/embeddings", {"model": model, "input": args["input"]}
    return "GET", "/v1/models", None


class _Inner:
    """One of the server's own routes answering this request's caller: run() dispatches it in
    this greenlet (auth, limits and counts as for any request), keeping its status, JSON and the
    tokens it generated (added to this request's log line)."""

    def __init__(self, method: str, path: str, body: dict[str, Any] | None):
        self.app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        # the caller's credentials and the name it reached the server by (no Origin: the /mcp
        # request passed that check)
        self.headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "x-api-key", "host")}
        self.remote = request.remote_addr or "127.0.0.1"
        self.socket = request.environ.get("bubo.socket")  # the client going away cancels the generation
        self.method, self.path, self.body = method, path, body
        self.record: dict[str, Any] = {}
        self.outer = request.environ.setdefault("bubo.log", {})
        self.status = 0
        self.answer: Any = None

    def run(self) -> None:
        path, _, query = self.path.partition("?")
        # an app context of its own: its g (the models it holds, the bodies it read) is not the /mcp request's
        base = {"REMOTE_ADDR": self.remote, **({"bubo.socket": self.socket} if self.socket is not None else {})}
        with self.app.app_context(), \
                self.app.test_request_context(path, method=self.method, query_string=query, headers=self.headers,
                                              json=self.body, environ_base=base) as ctx:
            ctx.request.environ[callers.INNER] = True
            self.record = ctx.request.environ.setdefault("bubo.log", {})
            try:
                resp = self.app.full_dispatch_request()
                try:
                    data = resp.get_data()
                finally:
                    resp.close()
            finally:
                callers.release_all(ctx.request.environ)  # whatever ended it, its generations are over
            self.status = resp.status_code
            try:
                self.answer = json.loads(data)
            except ValueError:
                self.answer = {"text": data.decode("utf-8", "replace")}
        for key in ("prompt_tokens", "generated_tokens"):
            if key in self.record:
                self.outer[key] = self.outer.get(key, 0) + self.record[key]
        if self.record.get("model"):
            self.outer.setdefault("model", self.record["model"])

    @property
    def generated(self) -> int:
        return int(self.record.get("generated_tokens") or 0)


def _tool_result(inner: _Inner) -> dict[str, Any]:
    text = json.dumps(inner.answer, ensure_ascii=False)
    if inner.status >= 400:
        return {"content": [{"type": "text", "text": text}], "isError": True}
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(inner.answer, dict):
        out["structuredContent"] = inner.answer
    return out


def _tool_call(params: dict[str, Any]) -> _Inner:
    """The route call of a tools/call (embed is taken even when no embedding model is listed: a
    model not loaded yet may be one; the route says when it is not)."""
    name = params.get("name")
    if not isinstance(name, str) or name not in TOOLS:
        raise RpcError(INVALID_PARAMS, f"unknown tool {name!r}: the tools are "
                                       f"{', '.join(t['name'] for t in _tools())}")
    args = params.get("arguments", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RpcError(INVALID_PARAMS, "arguments must be an object")
    check_arguments(args, TOOLS[name]["inputSchema"])
    return _Inner(*_route_call(name, args))


# --- the resources -------------------------------------------------------------------------------

_TEMPLATES = [
    {"uriTemplate": "bubo://contexts/{id}", "name": "context", "mimeType": oa.JSON,
     "description": "a context of yours (POST /v1/contexts): its object as GET /v1/contexts/{id} gives it"},
    {"uriTemplate": "bubo://responses/{id}", "name": "response", "mimeType": oa.JSON,
     "description": "a stored response of yours (POST /v1/responses): as GET /v1/responses/{id} gives it"},
]


def _context_models() -> list[str]:
    """The loaded models that keep contexts (a model asleep or unloaded keeps none)."""
    from bubo.engine.engine import Engine

    return [e.name for e in models().entries
            if isinstance(e.engine, Engine) and e.engine.ready and e.engine.kv is not None]


def _resources() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in _context_models():
        inner = _Inner("GET", f"/v1/contexts?model={quote(name, safe='')}", None)
        inner.run()
        for c in (inner.answer.get("data") or []) if inner.status == 200 else []:
            out.append({"uri": f"bubo://contexts/{c['id']}", "name": c["id"], "mimeType": oa.JSON,
                        "description": f"a context of {name}: {c['tokens']} tokens"})
    who = callers.caller()
    for id in response_store().ids(who):
        out.append({"uri": f"bubo://responses/{id}", "name": id, "mimeType": oa.JSON,
                    "description": "a stored response"})
    return out


def _read(params: dict[str, Any]) -> dict[str, Any]:
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, "resources/read needs a uri (a string)")
    kind, _, id = uri.removeprefix("bubo://").partition("/")
    if not uri.startswith("bubo://") or not _ID.fullmatch(id):
        raise RpcError(RESOURCE_NOT_FOUND, f"no resource {uri[:200]!r}: the resources are bubo://contexts/ID and "
                                           "bubo://responses/ID", {"uri": uri[:200]})
    paths = {"contexts": [f"/v1/contexts/{id}?model={quote(m, safe='')}" for m in _context_models()],
             "responses": [f"/v1/responses/{id}"]}.get(kind, [])
    for path in paths:
        inner = _Inner("GET", path, None)
        inner.run()
        if inner.status == 200:
            return {"contents": [{"uri": uri, "mimeType": oa.JSON, "text": json.dumps(inner.answer,
                                                                                      ensure_ascii=False)}]}
    raise RpcError(RESOURCE_NOT_FOUND, f"no resource {uri!r} of yours (deleted, or never made)", {"uri": uri})


# --- the methods ---------------------------------------------------------------------------------


def _initialize(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    asked = params.get("protocolVersion")
    version = asked if asked in VERSIONS else VERSIONS[-1]
    sid = _sessions().new(callers.caller(), version)
    result = {"protocolVersion": version,
              "capabilities": {"tools": {"listChanged": False}, "resources": {"listChanged": False}},
              "serverInfo": {"name": "bubo", "version": bubo.__version__},
              "instructions": "Tools run this machine's models: chat, complete, embed (embedding models) and "
                              "list_models. Resources are your contexts and stored responses."}
    return result, {"Mcp-Session-Id": sid}


def _answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": _tools()}
    if method == "tools/call":
        inner = _tool_call(params)
        inner.run()
        return _tool_result(inner)
    if method == "resources/list":
        return {"resources": _resources()}
    if method == "resources/templates/list":
        return {"resourceTemplates": _TEMPLATES}
    if method == "resources/read":
        return _read(params)
    raise RpcError(METHOD_NOT_FOUND, f"no method {method!r} here: the methods are initialize, ping, tools/list, "
                                     "tools/call, resources/list, resources/templates/list and resources/read")


def _reply(id: Any, result: Any = None, error: RpcError | None = None) -> dict[str, Any]:
    if error is not None:
        err: dict[str, Any] = {"code": error.code, "message": error.message}
        if error.data is not None:
            err["data"] = error.data
        return {"jsonrpc": "2.0", "id": id, "error": err}
    return {"jsonrpc": "2.0", "id": id, "result": result}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status=status, mimetype=oa.JSON, headers=headers or {})


def _message() -> dict[str, Any]:
    """The body: one JSON-RPC message (RpcError PARSE_ERROR or INVALID_REQUEST otherwise)."""
    try:
        msg = json.loads(request.get_data(cache=False))
    except (ValueError, RecursionError):
        raise RpcError(PARSE_ERROR, "the body is not JSON") from None
    if isinstance(msg, list):
        raise RpcError(INVALID_REQUEST, "send one JSON-RPC message per request (batches are not taken)")
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'a JSON-RPC 2.0 message is an object with "jsonrpc": "2.0"')
    is_request = "method" in msg and "id" in msg
    if "method" in msg and not isinstance(msg["method"], str):
        raise RpcError(INVALID_REQUEST, "method must be a string")
    if is_request and (msg["id"] is None or isinstance(msg["id"], bool) or not isinstance(msg["id"], (str, int))):
        raise RpcError(INVALID_REQUEST, "a request's id is a string or an integer")
    return msg


def _shapes() -> dict[str, oa.Schema]:
    return {"McpError": oa.obj({"jsonrpc": oa.const("2.0"), "id": {"type": ["string", "integer", "null"]},
                                "error": oa.obj({"code": {"type": "integer"}, "message": oa.STR, "data": {}},
                                                ["code", "message"])}, ["jsonrpc", "id", "error"])}


oa.components(blueprint, _shapes)


def _mcp_doc(d: oa.Doc) -> dict[str, oa.Op]:
    rpc = oa.obj({"jsonrpc": oa.const("2.0"), "id": {"type": ["string", "integer"]}, "method": oa.STR,
                  "params": oa.ANY_OBJECT}, ["jsonrpc"], closed=False)
    answer = {"description": "The JSON-RPC response; for a tools/call with a progressToken, server-sent events "
                             "(notifications/progress, then the response) when the client takes them",
              "content": {oa.JSON: {"schema": oa.ANY_OBJECT}, oa.SSE: {"schema": oa.STR}}}
    post = oa.Op({"operationId": "mcp", "summary": "The Model Context Protocol (Streamable HTTP, JSON-RPC 2.0)",
                  "tags": ["bubo"], "requestBody": oa.body(rpc, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
                  "responses": {"200": answer, "202": {"description": "A notification or response, taken"}}},
                 (400, 404), error_shape="McpError")
    end = oa.Op({"operationId": "mcp_end", "summary": "End an MCP session (Mcp-Session-Id)", "tags": ["bubo"],
                 "responses": {"200": {"description": "The session ended", "content": {oa.JSON: {
                     "schema": oa.ANY_OBJECT}}}}}, (400, 404), error_shape="McpError")
    listen = oa.Op({"operationId": "mcp_listen", "summary": "405: this server sends no unasked messages",
                    "tags": ["bubo"], "responses": {"405": {"description": "Not offered", "content": {
                        oa.JSON: {"schema": oa.ref("McpError")}}}}}, error_shape="McpError")
    return {"post": post, "delete": end, "get": listen}


@oa.route(blueprint, "/mcp", methods=("POST", "GET", "DELETE"), doc=_mcp_doc)
def mcp() -> Any:
    if request.method == "GET":
        return _json(405, _reply(None, error=RpcError(INVALID_REQUEST, "this server sends no messages unasked: "
                                                                       "there is no stream to open")),
                     {"Allow": "POST, DELETE"})
    if request.method == "DELETE":
        sid = request.headers.get("Mcp-Session-Id")
        if sid is None:
            return _json(400, _reply(None, error=RpcError(INVALID_REQUEST, "DELETE /mcp needs Mcp-Session-Id")))
        if not _sessions().end(sid, callers.caller()):
            return _json(404, _reply(None, error=RpcError(INVALID_REQUEST, "no such session")))
        return _json(200, {})
    version = request.headers.get("MCP-Protocol-Version")
    if version is not None and version not in VERSIONS:
        return _json(400, _reply(None, error=RpcError(INVALID_REQUEST, f"MCP-Protocol-Version {version[:40]!r} is "
                                                                       f"not one of {', '.join(VERSIONS)}")))
    try:
        msg = _message()
    except RpcError as e:
        return _json(400, _reply(None, error=e))
    if "method" not in msg or "id" not in msg:
        return Response(status=202)  # a notification, or a response to a request this server never sends
    id, method, params = msg["id"], msg["method"], msg.get("params") or {}
    if not isinstance(params, dict):
        return _json(200, _reply(id, error=RpcError(INVALID_PARAMS, "params must be an object")))
    if method == "initialize":
        result, headers = _initialize(params)
        return _json(200, _reply(id, result), headers)
    if not _session_known():
        return _json(404, _reply(id, error=RpcError(INVALID_REQUEST, "no such session: it ended or was never "
                                                                     "opened; send initialize again")))
    progress = (params.get("_meta") or {}).get("progressToken") if isinstance(params.get("_meta"), dict) else None
    if method == "tools/call" and progress is not None and oa.SSE in request.headers.get("Accept", ""):
        try:
            inner = _tool_call(params)
        except RpcError as e:
            return _json(200, _reply(id, error=e))
        return sse_response(_streamed(id, inner, progress))
    try:
        return _json(200, _reply(id, _answer(method, params)))
    except RpcError as e:
        return _json(200, _reply(id, error=e))


def _streamed(id: Any, inner: _Inner, token: Any) -> Iterator[Any]:
    """A tool call as server-sent events: how many tokens the answer has (0 as it starts, then
    every PROGRESS_EVERY_S while it grows), then the response. The client going away ends the
    call (its generation is cancelled)."""
    job = gevent.spawn(inner.run)
    try:
        said, t0 = -1, time.monotonic()
        while not job.ready():
            if inner.generated != said:
                said = inner.generated
                yield ("message", {"jsonrpc": "2.0", "method": "notifications/progress",
                                   "params": {"progressToken": token, "progress": said,
                                              "message": f"{said} tokens in {time.monotonic() - t0:.1f} s"}})
            job.join(PROGRESS_EVERY_S)
        try:
            job.get()
        except Exception as e:  # noqa: BLE001 - a bug: still a JSON-RPC answer to the call
            log.exception("an MCP tool call failed")
            yield ("message", _reply(id, error=RpcError(INTERNAL_ERROR, f"internal error: {type(e).__name__}: {e}")))
            return
        yield ("message", _reply(id, _tool_result(inner)))
    finally:
        job.kill(block=True)

