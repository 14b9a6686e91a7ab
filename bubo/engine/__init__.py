"""The engine thread: requests in (GenerationRequest), events out (EventStream)."""

from bubo.engine.engine import Engine, EventStream
from bubo.engine.types import (ContextLengthError, ErrorEvent, Event, FinishEvent, GenerationRequest,
                               InsufficientMemoryError, NotReadyError, QueueFullError, TokenEvent)

__all__ = ["ContextLengthError", "Engine", "ErrorEvent", "Event", "EventStream", "FinishEvent",
           "GenerationRequest", "InsufficientMemoryError", "NotReadyError", "QueueFullError", "TokenEvent"]
