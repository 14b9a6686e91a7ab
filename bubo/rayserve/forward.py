"""What crosses from the ingress to a replica, and the errors the ingress makes itself.

A replica answers with bubo's own server, so every route, dialect, stream and API key check is
the one `bubo serve` has. The ingress makes only the errors no replica can: a replica lost while
it held the request (503 with Retry-After, or the dialect's in-band error where the 200 of a
stream had gone out), and a body over the limit, in the shape of the route's dialect
(bubo.api.errors). No Ray here."""

from __future__ import annotations

from dataclasses import dataclass, field

from bubo.api.errors import ApiError, StreamShape, error_response, is_anthropic_path, is_ollama_path, stream_error
from bubo.api.sse import format_event, format_line

# the replica's first item: it holds the request from here on (before it, a lost replica never
# saw the request, and the ingress sends it to another)
ACCEPTED = "accepted"
REPLICA_LOST_RETRY_AFTER_S = 2
# connection-level headers (and the ones each server writes): each hop sets its own
_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
                  "host", "content-length", "date", "server"))


@dataclass(frozen=True)
class Forward:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    prefix: tuple[int, ...] = field(default=())  # bubo.rayserve.prefix.prefix_key: what the router reads


@dataclass(frozen=True)
class Head:
    status: int
    headers: tuple[tuple[str, str], ...]
    replica: str


def end_to_end(headers: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """headers without the hop-by-hop ones."""
    return tuple((k, v) for k, v in headers if k.lower() not in _HOP)


def error_body(path: str, err: ApiError) -> bytes:
    """A whole answer's error body, in the route's dialect: `bubo serve`'s own (error_response)."""
    return bytes(error_response(path, err).get_data())


def stream_error_bytes(path: str, content_type: str, err: ApiError) -> bytes:
    """The in-band error that ends a stream whose 200 went out: an SSE event, or an NDJSON line."""
    if "ndjson" in content_type or (is_ollama_path(path) and "event-stream" not in content_type):
        return format_line(stream_error(StreamShape.OLLAMA, err)).encode()
    if is_anthropic_path(path):
        shape = StreamShape.ANTHROPIC
    elif path.rstrip("/").endswith("/responses"):
        shape = StreamShape.RESPONSES
    else:
        shape = StreamShape.OPENAI
    return format_event(stream_error(shape, err)).encode()


def replica_lost(detail: str) -> ApiError:
    return ApiError(503, "replica_lost",
                    f"the replica serving this request stopped ({detail}); send the request again",
                    headers={"Retry-After": str(REPLICA_LOST_RETRY_AFTER_S)})


def no_replica(detail: str) -> ApiError:
    return ApiError(503, "no_replica", f"no replica could take the request ({detail}); send it again shortly",
                    headers={"Retry-After": str(REPLICA_LOST_RETRY_AFTER_S)})
