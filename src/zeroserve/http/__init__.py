"""HTTP/1.1 without I/O: request parsing and limits, response framing as buffer lists."""

from .connection import BodyComplete, BodySink, HttpConnection, RequestHead, State
from .limits import HttpLimits
from .response import CONTINUE, LAST_CHUNK, chunk, encode_head, sse_event, status_line

__all__ = [
    "CONTINUE",
    "LAST_CHUNK",
    "BodyComplete",
    "BodySink",
    "HttpConnection",
    "HttpLimits",
    "RequestHead",
    "State",
    "chunk",
    "encode_head",
    "sse_event",
    "status_line",
]
