"""The engine: requests in (GenerationRequest), events out (EventStream), on a Runtime.

engine.Engine is one model on its own thread; registry.Registry maps model names to engines
(load, unload, idle sleep, LRU); protocol.ServingEngine is what the api layer needs of an engine."""

from bubo.engine.engine import CacheView, Engine, EventStream
from bubo.engine.types import (
                               ContextLengthError,
                               EngineMetrics,
                               EngineRefusal,
                               ErrorEvent,
                               Event,
                               FinishEvent,
                               GenerationRequest,
                               InsufficientMemoryError,
                               InvalidRequestError,
                               NotReadyError,
                               QueueFullError,
                               Reason,
                               SlotPhase,
                               SlotState,
                               Timings,
                               TokenEvent,
)

__all__ = ["CacheView", "ContextLengthError", "Engine", "EngineMetrics", "EngineRefusal", "ErrorEvent", "Event",
           "EventStream", "FinishEvent", "GenerationRequest", "InsufficientMemoryError", "InvalidRequestError",
           "NotReadyError", "QueueFullError", "Reason", "SlotPhase", "SlotState", "Timings", "TokenEvent"]
