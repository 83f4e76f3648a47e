"""The inference runtime: arena, channels, admission, deadlines, batcher, executors.

The app layer uses :class:`Engine` and the names below; everything else is private.
"""

from ..errors import ModelLoadError, StreamAborted
from .admission import AdmissionStatistics, QueueWatch, Ticket
from .arena import Arena, ArenaStatistics, Lease, attach
from .batcher import BatcherStatistics
from .channel import Channel, ChannelStatistics, Policy
from .clock import Clock, ManualClock
from .engine import ChannelTotals, Engine, EngineStatistics, EngineStatus
from .handle import ModelHandle, ModelStatistics, ModelStatus
from .options import ModelConfig, ResolvedModel, RuntimeOptions
from .results import InferResult, WorkerStatistics
from .slots import SlotPool, SlotStatistics, SlotStream
from .stream import Stream

__all__ = [
    "AdmissionStatistics",
    "Arena",
    "ArenaStatistics",
    "BatcherStatistics",
    "Channel",
    "ChannelStatistics",
    "ChannelTotals",
    "Clock",
    "Engine",
    "EngineStatistics",
    "EngineStatus",
    "InferResult",
    "Lease",
    "ManualClock",
    "ModelConfig",
    "ModelHandle",
    "ModelLoadError",
    "ModelStatistics",
    "ModelStatus",
    "Policy",
    "QueueWatch",
    "ResolvedModel",
    "RuntimeOptions",
    "SlotPool",
    "SlotStatistics",
    "SlotStream",
    "Stream",
    "StreamAborted",
    "Ticket",
    "WorkerStatistics",
    "attach",
]
