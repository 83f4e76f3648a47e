"""The Files and Batch APIs' shapes, as OpenAI defines them (msgspec Structs, decoded and
encoded once)."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from ...errors import RequestError

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
# The statuses a batch ends in; the others are open (the runner works on them).
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
# The endpoints a line may name: the chat-like APIs and embeddings (docs/architecture.md,
# "The Batch API").
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


class FileObject(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None


class FileList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = False


class FileDeleted(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchError(Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class BatchObject(Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None


class BatchList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/batches``. ``metadata``: up to 16 pairs, as OpenAI allows."""

    input_file_id: str
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None


class LineIn(Struct, kw_only=True):
    """One line of an input file; the body stays raw (the route's own decode checks it)."""

    custom_id: str | None = None
    method: str | None = None
    url: str | None = None
    # Raw cannot be in a union: an empty Raw stands for a line without a body.
    body: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


class BodyPeek(Struct, kw_only=True):
    """What the runner reads of a line's body before running it: which model (it bounds
    the lines per model) and whether it asks to stream (a batch answers whole)."""

    model: object = None
    stream: object = None


class LineResponse(Struct, kw_only=True):
    status_code: int
    request_id: str
    body: msgspec.Raw


class LineError(Struct, kw_only=True):
    code: str
    message: str


class LineResult(Struct, kw_only=True, omit_defaults=False):
    """One line of an output or error file."""

    id: str
    custom_id: str | None
    response: LineResponse | None = None
    error: LineError | None = None


encoder = msgspec.json.Encoder()
batch_create_decoder = msgspec.json.Decoder(BatchCreate)
line_decoder = msgspec.json.Decoder(LineIn)
peek_decoder = msgspec.json.Decoder(BodyPeek)
line_result_decoder = msgspec.json.Decoder(LineResult)


def decode_create(body: memoryview) -> BatchCreate:
    """The create request, or a 400 naming the field at fault."""
    try:
        return batch_create_decoder.decode(body)
    except msgspec.ValidationError as exc:
        # msgspec's message may quote the value; error bodies never echo input.
        param = _path(str(exc))
        hint = _HINTS.get(param or "", "")
        what = f"the field {param!r} is missing or invalid" if param else "a field is missing"
        raise RequestError(f"invalid batch request: {what}{hint}", param=param) from None
    except msgspec.DecodeError:
        raise RequestError("the body is not valid JSON") from None


_HINTS = {
    "endpoint": f"; one of {', '.join(ENDPOINTS)}",
    "completion_window": "; only '24h' is served",
    "metadata": "; an object of strings",
}


def _path(message: str) -> str | None:
    # msgspec names the field as "at `$.endpoint`".
    if "`$." in message:
        return message.split("`$.", 1)[1].split("`", 1)[0].split("[", 1)[0] or None
    return None
