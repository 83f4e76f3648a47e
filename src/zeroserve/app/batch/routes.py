"""The Files and Batch API routes (OpenAI's shapes; errors in OpenAI's ``{"error": …}``
body): ``/v1/files`` and ``/v1/batches`` (docs/architecture.md, "The Batch API").

Files and batches belong to the API key that made them (its name; ``""`` when the
server has no keys): another key's id answers 404, as an unknown one does. Every limit
is checked before work starts: the upload's size at its head (413 before a byte of the
body is read), its lines when it arrives, a batch's lines, the key's open batches and
the disk space when it is created.
"""

from __future__ import annotations

import functools
import mmap
import os
import sqlite3
from collections.abc import Callable
from typing import Any

from ...edge import Edge
from ...errors import Overloaded, PayloadTooLarge, RequestError, ZeroserveError
from ...runtime import Engine
from ..apidoc import RouteDoc
from ..request import Request
from ..response import OCTET, Response, json_response
from ..router import Router
from . import schemas as s
from . import upload
from .options import BatchOptions
from .runner import BatchRunner
from .store import BatchStore

# Room for the form around the file (boundaries, part heads, the purpose field), bytes.
FORM_OVERHEAD_BYTES = 64 * 1024
# Batches a list answers at most, and by default (OpenAI's values).
LIST_MAX, LIST_DEFAULT = 100, 20
# How long a key over its open batches is told to wait, seconds.
OPEN_BATCHES_RETRY_S = 60.0
# POST /v1/files as /openapi.json documents it: the form the openai SDK sends.
UPLOAD_BODY = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["purpose", "file"],
            "properties": {
                "purpose": {
                    "type": "string",
                    "enum": ["batch"],
                    "description": "the only purpose served",
                },
                "file": {
                    "type": "string",
                    "format": "binary",
                    "description": (
                        "JSONL: one batch request object per line ({custom_id, method: POST, "
                        "url, body}); the server's batch limits bound its bytes, its lines "
                        "and each line's bytes (a 400 or 413 naming file)"
                    ),
                },
            },
        },
        "encoding": {"file": {"contentType": "application/jsonl, application/octet-stream"}},
    }
}


class BatchApi:
    """The Files and Batch APIs over one store and its runner."""

    def __init__(self, options: BatchOptions, router: Router, engine: Engine, edge: Edge) -> None:
        self.options = options
        self.store = BatchStore(options.data_dir, options.wall)
        self.runner = BatchRunner(self.store, options, router, engine, edge)

    def register(self, router: Router) -> None:
        def add(method: str, path: str, handler: Callable[[Request], Response], **kw: Any) -> None:
            router.add(method, path, _busy_answered(handler), **kw)

        add(
            "POST",
            "/v1/files",
            self.create_file,
            on_head=self._upload_head,
            doc=RouteDoc(
                "Upload a batch input file (multipart/form-data: purpose=batch, file: JSONL)",
                None,
                s.FileObject,
                body=UPLOAD_BODY,
            ),
        )
        add("GET", "/v1/files", self.list_files, doc=RouteDoc("List your files", None, s.FileList))
        add(
            "GET",
            "/v1/files/{file_id}",
            self.get_file,
            doc=RouteDoc("Describe one file", None, s.FileObject),
        )
        add(
            "DELETE",
            "/v1/files/{file_id}",
            self.delete_file,
            doc=RouteDoc("Delete a file", None, s.FileDeleted),
        )
        add(
            "GET",
            "/v1/files/{file_id}/content",
            self.file_content,
            doc=RouteDoc("A file's bytes", None, None),
        )
        add(
            "POST",
            "/v1/batches",
            self.create_batch,
            doc=RouteDoc("Create a batch over an uploaded file", s.BatchCreate, s.BatchObject),
        )
        add(
            "GET",
            "/v1/batches",
            self.list_batches,
            doc=RouteDoc("List your batches, newest first (after, limit)", None, s.BatchList),
        )
        add(
            "GET",
            "/v1/batches/{batch_id}",
            self.get_batch,
            doc=RouteDoc("Describe one batch", None, s.BatchObject),
        )
        add("POST", "/v1/batches/{batch_id}/cancel", self.cancel_batch,
            doc=RouteDoc("Cancel a batch", None, s.BatchObject, body={}))  # fmt: skip

    def start(self) -> None:
        self.runner.start()

    async def aclose(self) -> None:
        await self.runner.aclose()
        self.store.close()

    # -- files -------------------------------------------------------------------------------
    def _upload_head(self, req: Request) -> None:
        """Refuse an upload at its head: its size (413) and the disk space left (507)."""
        size = req.head.content_length
        limit = self.options.max_file_bytes + FORM_OVERHEAD_BYTES
        if size is None:  # chunked: its size is checked as it arrives (UploadFile)
            size = 0
        elif size > limit:
            raise PayloadTooLarge(f"a batch file may be up to {self.options.max_file_bytes} bytes")
        upload.boundary(req.header(b"content-type"))
        # Twice: the form as it arrives, then the file cut out of it.
        self.store.check_space(2 * size, self.options.min_free_bytes)
        req.store_body(upload.UploadFile(self.store.upload_path(), limit))

    def create_file(self, req: Request) -> Response:
        stored = req.take_body_store()
        assert isinstance(stored, upload.UploadFile), "the head hook stores the upload"
        try:
            stored.finish()
            if stored.too_large:
                raise PayloadTooLarge(
                    f"a batch file may be up to {self.options.max_file_bytes} bytes"
                )
            if stored.error is not None:
                self.store.check_space(0, self.options.min_free_bytes)  # 507 if that is why
                raise ZeroserveError("the upload could not be stored")
            if not stored.size:
                raise RequestError("the form is empty", param="file")
            with open(stored.path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                return self._file_from_form(req, memoryview(mapped))
            finally:
                try:
                    mapped.close()
                except BufferError:  # a view of it is still referenced: it goes with that
                    pass
        finally:
            stored.discard()

    def _file_from_form(self, req: Request, form_view: memoryview) -> Response:
        with form_view:
            form = upload.parts(form_view, upload.boundary(req.header(b"content-type")))
            purpose = form.get("purpose")
            if purpose is None or bytes(form_view[purpose.start : purpose.end]).strip() != b"batch":
                raise RequestError(
                    "purpose must be 'batch' (the only purpose served)", param="purpose"
                )
            part = form.get("file")
            if part is None or part.filename is None:
                raise RequestError("the form has no file part", param="file")
            opts = self.options
            if part.end - part.start > opts.max_file_bytes:
                raise PayloadTooLarge(f"a batch file may be up to {opts.max_file_bytes} bytes")
            with form_view[part.start : part.end] as data:
                lines = upload.count_lines(data, opts.max_line_bytes, opts.max_lines)
                fid, path = self.store.part_path()
                try:
                    upload.write(path, data)
                    row = self.store.add_file(
                        fid,
                        path,
                        _owner(req),
                        os.path.basename(part.filename)[:255],
                        "batch",
                        lines,
                    )
                except BaseException:
                    path.unlink(missing_ok=True)
                    raise
        return json_response(row.public())

    def list_files(self, req: Request) -> Response:
        return json_response(s.FileList(data=[f.public() for f in self.store.files(_owner(req))]))

    def get_file(self, req: Request) -> Response:
        return json_response(self.store.file(req.params["file_id"], _owner(req)).public())

    def delete_file(self, req: Request) -> Response:
        self.store.delete_file(req.params["file_id"], _owner(req))
        return json_response(s.FileDeleted(id=req.params["file_id"]))

    def file_content(self, req: Request) -> Response:
        """The file's bytes from its mapping: the transport writes them from the page
        cache's pages, with no copy in user space (the mapping is closed once sent)."""
        row = self.store.file(req.params["file_id"], _owner(req))
        if not row.bytes:
            return Response(200, [], content_type=OCTET)
        with open(self.store.path(row.id), "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(mapped)
        return Response(200, [view], content_type=OCTET, release=[_closer(mapped, view)])

    # -- batches -----------------------------------------------------------------------------
    def create_batch(self, req: Request) -> Response:
        body = s.decode_create(req.body)
        owner = _owner(req)
        source = self.store.file(body.input_file_id, owner)
        if source.purpose != "batch":
            raise RequestError("the input file is not a batch input file", param="input_file_id")
        if source.lines > self.options.max_lines:
            raise RequestError(
                f"a batch may have up to {self.options.max_lines} requests",
                param="input_file_id",
            )
        if body.metadata is not None and len(body.metadata) > 16:
            raise RequestError("metadata has at most 16 pairs", param="metadata")
        if self.store.open_count(owner) >= self.options.max_open_batches:
            exc = Overloaded(
                f"this key has {self.options.max_open_batches} batches that have not ended",
                retry_after=OPEN_BATCHES_RETRY_S,
            )
            exc.code = "batch_limit_exceeded"
            raise exc
        # Its results are written beside it: about its size again, at most.
        self.store.check_space(2 * source.bytes, self.options.min_free_bytes)
        batch = self.store.create_batch(owner, body, source)
        self.runner.wake()
        return json_response(batch)

    def list_batches(self, req: Request) -> Response:
        q = req.query
        try:
            limit = int(q.get("limit", LIST_DEFAULT))
        except ValueError:
            raise RequestError("limit is an integer", param="limit") from None
        if not 1 <= limit <= LIST_MAX:
            raise RequestError(f"limit is from 1 to {LIST_MAX}", param="limit")
        data, more = self.store.batches(_owner(req), q.get("after"), limit)
        return json_response(
            s.BatchList(
                data=data,
                first_id=data[0].id if data else None,
                last_id=data[-1].id if data else None,
                has_more=more,
            )
        )

    def get_batch(self, req: Request) -> Response:
        return json_response(self.store.batch(req.params["batch_id"], _owner(req)))

    def cancel_batch(self, req: Request) -> Response:
        batch = self.store.cancel(req.params["batch_id"], _owner(req))
        self.runner.wake()
        return json_response(batch)


def _owner(req: Request) -> str:
    edge = req.edge
    name = edge.key_name if edge is not None else None
    return name or ""


def _closer(mapped: mmap.mmap, view: memoryview) -> Callable[[], None]:
    def close() -> None:
        try:
            view.release()
            mapped.close()
        except BufferError:  # the transport still holds a slice: it goes with that slice
            pass

    return close


def _busy_answered(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """``handler``, with the store's lock wait past ``LOOP_BUSY_S`` (another worker holds
    the database's write lock) answered 503 with ``Retry-After`` (docs/batch.md)."""

    @functools.wraps(handler)
    def answered(req: Request) -> Response:
        try:
            return handler(req)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            raise Overloaded("the batch store is busy; retry", status=503) from None

    return answered
