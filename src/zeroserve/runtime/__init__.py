"""The inference runtime: arena, channels, admission, deadlines, batcher, executors.

The app layer uses :class:`Engine` and the names below; everything else is private.
"""

from ._common import InferResult, ModelLoadError, WorkerStatistics
from .admission import AdmissionStatistics, Ticket
from .arena import Arena, ArenaStatistics, Lease, attach
from .batcher import BatcherStatistics
from .channel import Channel, ChannelStatistics, Policy, StreamAborted
from .clock import Clock, ManualClock
from .engine import (
    ChannelTotals,
    Engine,
    EngineStatistics,
    ModelConfig,
    ModelHandle,
    ModelStatistics,
    RuntimeOptions,
    Stream,
)

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
    "InferResult",
    "Lease",
    "ManualClock",
    "ModelConfig",
    "ModelHandle",
    "ModelLoadError",
    "ModelStatistics",
    "Policy",
    "RuntimeOptions",
    "Stream",
    "StreamAborted",
    "Ticket",
    "WorkerStatistics",
    "attach",
]
