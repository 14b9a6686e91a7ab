"""The engine: requests in (GenerationRequest), events out (EventStream), on a Runtime.

The rooms: scheduler.Scheduler is the core (slots, queue, one step at a time; no threads);
engine.Engine runs a scheduler on its own thread for the server, its events reaching greenlets
through streams.py; bubo.llm.Model steps one in the caller's thread for the library; memory
holds the memory budget and the context's default size; registry.Registry maps model names to
engines (load, unload, idle sleep, LRU); protocol.ServingEngine is what the api layer needs of an
engine. This package's own names are the types only, so `import bubo` never loads gevent."""

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

__all__ = ["ContextLengthError", "EngineMetrics", "EngineRefusal", "ErrorEvent", "Event", "FinishEvent",
           "GenerationRequest", "InsufficientMemoryError", "InvalidRequestError", "NotReadyError", "QueueFullError",
           "Reason", "SlotPhase", "SlotState", "Timings", "TokenEvent"]
