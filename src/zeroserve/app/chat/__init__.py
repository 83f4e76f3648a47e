"""One chat path (docs/architecture.md, "One chat path"): the chat request every front
end translates into, the answer every backend produces, and the fan-out of a request's
choices."""

from .choices import Choices, QueuedChoice, admit, collect_all
from .output import CallDelta, Collected, DeltaPiece, Finish, Output, Piece, collect
from .request import ChatRequest, FunctionTool, OutputFormat, ToolCall, ToolChoice, Turn

__all__ = [
    "CallDelta",
    "ChatRequest",
    "Choices",
    "Collected",
    "DeltaPiece",
    "Finish",
    "FunctionTool",
    "Output",
    "OutputFormat",
    "Piece",
    "QueuedChoice",
    "ToolCall",
    "ToolChoice",
    "Turn",
    "admit",
    "collect",
    "collect_all",
]
