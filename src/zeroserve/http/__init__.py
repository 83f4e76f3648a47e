"""HTTP/1.1 without I/O, both roles: the server connection (requests in, responses out),
the client's response reader, the chunked coding both share, and response framing as
buffer lists (docs/architecture.md, "HTTP/1.1: one connection, both roles")."""

from .chunked import ChunkedDecoder
from .connection import BodyComplete, BodySink, HttpConnection, RequestHead, State
from .framing import CONTINUE, LAST_CHUNK, StreamFramer, chunk, encode_head, sse_event, status_line
from .limits import HttpLimits

__all__ = [
    "CONTINUE",
    "LAST_CHUNK",
    "BodyComplete",
    "BodySink",
    "ChunkedDecoder",
    "HttpConnection",
    "HttpLimits",
    "RequestHead",
    "State",
    "StreamFramer",
    "chunk",
    "encode_head",
    "sse_event",
    "status_line",
]
