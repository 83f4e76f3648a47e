"""The worker wire protocol: control frames between the server and a worker (a spawned
process worker, or a same-node Ray actor on its link).

Frames are a 4-byte little-endian length then one msgspec msgpack message (a tagged
union, encoders and decoders built once). Only control data travels here: tensors stay
in the shared arena and are named by :class:`~.tensors.TensorDesc`. The exceptions are
small by nature: embedding vectors, and stream pieces that are not already in the arena.

Every request id sent to a worker gets exactly one terminal answer (``InferDone``,
``EmbedDone``, ``End`` or ``Fail``), even when it was aborted, so the server always
learns when the worker is done with the leases of that request.

Streams use credits, like HTTP/2 windows: ``Generate.window`` pieces may be sent before
any ``Credit`` arrives; each piece spends one (a ``Pieces`` frame carries several); the server returns credits as its
consumer takes pieces. A worker never writes a piece it has no credit for, so one slow
stream only ever stops itself.
"""

from __future__ import annotations

import asyncio
import struct

import msgspec

from ..tensors import TensorDesc

HEADER = struct.Struct("<I")
# A control frame larger than this is a protocol error (a bug), not a payload: payloads
# live in the arena. 64 MiB leaves room for a large embedding batch.
MAX_FRAME_BYTES = 64 << 20


class _Msg(msgspec.Struct, array_like=True, tag=True):
    pass


# -- server -> worker ----------------------------------------------------------------------
class Infer(_Msg, tag="infer"):
    id: int
    batch: list[dict[str, TensorDesc]]


class Embed(_Msg, tag="embed"):
    id: int
    texts: list[str]


class Generate(_Msg, tag="gen"):
    id: int
    req: bytes  # msgpack of GenerateRequest with raw=None
    raw: TensorDesc | None
    window: int


class Credit(_Msg, tag="credit"):
    id: int
    n: int


class Abort(_Msg, tag="abort"):
    id: int


class Allocated(_Msg, tag="allocated"):
    id: int
    offsets: list[int]
    error: str = ""


class Shutdown(_Msg, tag="shutdown"):
    pass


# -- worker -> server ----------------------------------------------------------------------
class Ready(_Msg, tag="ready"):
    pid: int


class LoadFailed(_Msg, tag="load_failed"):
    error: str


class Alloc(_Msg, tag="alloc"):
    id: int
    sizes: list[int]


class InferDone(_Msg, tag="infer_done"):
    id: int
    outputs: list[dict[str, TensorDesc]]
    copied: int = 0  # bytes the worker copied into leases it requested


class EmbedDone(_Msg, tag="embed_done"):
    id: int
    data: bytes
    shape: tuple[int, ...]


class Blob(msgspec.Struct, array_like=True, tag="b"):
    """A bytes piece outside the arena, copied into the frame (small by nature)."""

    data: bytes


class InArena(msgspec.Struct, array_like=True, tag="a"):
    """A bytes piece already in the arena (an echo of the request body): no copy."""

    offset: int
    length: int


class Pieces(_Msg, tag="pieces"):
    """A stream's next pieces, in order, each one credit. A sync generator's pieces come
    many to a frame (``stepping.SlicedSteps``)."""

    id: int
    items: list[str | Blob | InArena]


class End(_Msg, tag="end"):
    id: int
    result: str | None = None  # the generator's return value (a finish reason), if a str


class Fail(_Msg, tag="fail"):
    id: int
    error: str  # the errors-module class name
    message: str
    status: int


# -- opening a link to a Ray actor ---------------------------------------------------------
class Link(_Msg, tag="link"):
    """The first frame on a connection to a same-node Ray actor's link socket: the arena's
    token, which only the ingress (and whoever attached its arena) knows. The actor
    answers ``Ready`` and serves the worker protocol, or closes the connection."""

    token: bytes


ToWorker = Infer | Embed | Generate | Credit | Abort | Allocated | Shutdown
ToServer = Ready | LoadFailed | Alloc | InferDone | EmbedDone | Pieces | End | Fail

ENCODER = msgspec.msgpack.Encoder()
TO_WORKER = msgspec.msgpack.Decoder(ToWorker)
TO_SERVER = msgspec.msgpack.Decoder(ToServer)
LINK = msgspec.msgpack.Decoder(Link)


def frame(msg: _Msg) -> bytes:
    body = ENCODER.encode(msg)
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """One frame's body. Raises ``asyncio.IncompleteReadError`` at EOF."""
    head = await reader.readexactly(HEADER.size)
    (n,) = HEADER.unpack(head)
    if n > MAX_FRAME_BYTES:
        raise ValueError(f"control frame of {n} bytes exceeds {MAX_FRAME_BYTES}")
    return await reader.readexactly(n)
