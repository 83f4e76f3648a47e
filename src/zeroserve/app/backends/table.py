"""The backend of every served model, chosen once per model (docs/architecture.md,
"Adding a backend").

:class:`Backends` is the table ``{model name: backend}``: a backend is built when its
model becomes ready (:meth:`Backends.add`) and dropped when it goes away
(:meth:`Backends.remove`), by the factory that the model's ``served_by`` names in
:data:`FACTORIES`. A handler reads ``"model"`` once, looks the backend up and calls it:
:meth:`Backends.chat` and :meth:`Backends.embeddings` are the whole dispatch of the
chat-like and embedding APIs. A model whose backend relays requests undecoded
(``forwards``) is found from the body's ``"model"`` alone (a scan of the bytes, no
decode), and only when such a model is served; every other request is decoded once, by
its front end.

A request for a model that is not loaded but may be loaded on demand (``Autoload``: a
``--models-dir`` entry with autoload on, docs/architecture.md, "Models at run time") is
answered by a task that waits for the load, within the request's deadline, and then
dispatches as if the model had been there: the load adds the backend through
:meth:`Backends.model_loaded`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import msgspec

from ... import metrics
from ...errors import ModelNotFound, RequestError
from ...runtime import Engine, ModelHandle
from ...upstream import UpstreamStatistics
from ...upstream.image_fetch import ImageFetchPolicy
from ..chat import ChatRequest
from ..keep_alive import keep_alive_s
from ..openai import schemas as s
from ..relay._rewrite import model_spans
from ..request import Request
from ..response import HandlerResult, Response, StreamResponse
from .base import Backend, BackendStatistics, FrontEnd
from .images import with_images
from .llamacpp import LlamaCppBackend
from .local import LocalBackend
from .remote import RemoteBackend

# A model's ``served_by`` -> the backend that serves it. A new backend is one module and
# one line here.
FACTORIES: dict[str, Callable[[ModelHandle], Backend]] = {
    "local": LocalBackend,
    "llamacpp": LlamaCppBackend,
    "remote": RemoteBackend,
}
# The metric source of the relays' upstreams, zeroserve_upstream_<field>{name="<model>
# <url>"}, cumulative fields as *_total counters (histograms in app/relay/_relay.py).
UPSTREAM_COUNTERS = (
    "requests",
    "errors",
    "ejections",
    "connects",
    "reused",
    "read_pauses",
    "batches",
    "coalesced",
)


class Autoload(Protocol):
    """Loads a model a request names, on demand."""

    def can_load(self, name: str) -> bool:
        """Whether ``name`` is a model that is not served now but may be loaded for a
        request (cheap: called when a request names a model not in the table)."""

    async def wait_loaded(self, name: str, req: Request, timeout_s: float | None = None) -> None:
        """Load ``name`` (or join its load) within ``req``'s deadline (``timeout_s``: the
        timeout the request's API asked for, when it is not the OpenAI SDK's header);
        raise the error the request is answered with when it cannot be loaded in time."""


class Backends:
    """The backends of an engine's models, by name."""

    def __init__(self, engine: Engine, image_fetch: ImageFetchPolicy | None = None) -> None:
        self.engine = engine
        self.autoload: Autoload | None = None
        # A request's keep_alive goes here (the model manager's ask_keep_alive); None:
        # no model is loaded at run time, and a keep_alive is refused (400).
        self.keep_alive: Callable[[str, float], None] | None = None
        # Where chat images may be fetched from (None: remote image URLs are refused).
        self.image_fetch = image_fetch
        self._table: dict[str, Backend] = {}
        self._forwarding = 0  # backends that relay requests undecoded
        for name in engine.names():
            self.add(name)
        metrics.register_source("upstream", self._upstreams, counters=UPSTREAM_COUNTERS)

    def add(self, name: str) -> Backend:
        """Build the backend of model ``name`` (ready in the engine)."""
        backend = self._table[name] = self._build(name)
        self._forwarding += backend.forwards
        return backend

    def _build(self, name: str) -> Backend:
        handle = self.engine.model(name)
        factory = FACTORIES.get(handle.model.served_by)
        if factory is None:
            raise ValueError(f"model {name!r} is served by {handle.model.served_by!r}, unknown")
        return factory(handle)

    async def remove(self, name: str) -> None:
        """Drop model ``name``'s backend (the model is going away)."""
        backend = self._table.pop(name)
        self._forwarding -= backend.forwards
        await backend.aclose()

    # The model manager's listener (runtime/model_manager.py, ModelListener).
    def model_loaded(self, name: str) -> None:
        self.add(name)

    def model_replaced(self, name: str) -> Callable[[], Awaitable[None]]:
        """``name``'s new version serves (runtime/model_replace.py): its backend takes
        the old one's place now; the old one is closed by the returned call, once the old
        version has finished its work (its streams may still use it until then)."""
        fresh = self._build(name)
        old = self._table[name]
        self._table[name] = fresh
        self._forwarding += fresh.forwards - old.forwards
        return old.aclose

    async def model_unloaded(self, name: str) -> None:
        if name in self._table:
            await self.remove(name)

    def get(self, name: str) -> Backend:
        backend = self._table.get(name)
        if backend is None:
            # The message does not repeat the name: error bodies never echo input.
            raise ModelNotFound(
                "the requested model is not served here; GET /v1/models lists the models",
                param="model",
            )
        return backend

    def admitted(self, name: str, req: Request) -> Backend:
        """The backend of ``name``, ``req`` admitted to its model's queue as any request
        to it (a 429 past its bound), its ticket held until the answer: for model work
        outside the chat path (a tokenizer's call)."""
        backend = self.get(name)
        req.admit(self.engine.model(backend.name))
        return backend

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._table.values())

    # -- dispatch --------------------------------------------------------------------------
    def _forwarder(self, req: Request) -> Backend | None:
        """The backend of the body's ``"model"`` if it relays requests undecoded (the
        request then admitted: 429 raised here); None otherwise, and always when no such
        backend is served (then the body is not scanned at all)."""
        if not self._forwarding:
            return None
        spans = model_spans(req.body)
        if not spans:
            return None  # not a JSON object with a model: the front end's decode says why
        start, end = spans[-1]
        try:
            name = msgspec.json.decode(req.body[start:end])
        except msgspec.DecodeError:
            return None
        backend = self._table.get(name) if isinstance(name, str) else None
        if backend is None or not backend.forwards:
            return None
        req.admit(self.engine.model(name))
        return backend

    def chat(self, api: FrontEnd, req: Request) -> HandlerResult:
        """Serve a chat-like API's request."""
        backend = self._forwarder(req)
        if backend is not None:
            return backend.forward(req, api.upstream_path)
        chat = api.decode(req)
        req.ask_priority(chat.priority)
        self._ask_keep_alive(chat.model, chat.keep_alive)
        if self._loadable(chat.model):
            return self._after_load(
                chat.model, req, api.upstream_path, lambda b: self._chat(b, api, chat, req)
            )
        return self._chat(self.get(chat.model), api, chat, req)

    def embeddings(
        self, req: Request, decode: Callable[[Request], s.EmbeddingRequest]
    ) -> HandlerResult:
        """Serve an embeddings request (``decode``: the API's decode and checks)."""
        backend = self._forwarder(req)
        if backend is not None:
            return backend.forward(req, "/embeddings")
        body = decode(req)
        req.ask_priority(body.priority)
        self._ask_keep_alive(body.model, keep_alive_s(body.keep_alive))
        if self._loadable(body.model):
            return self._after_load(
                body.model, req, "/embeddings", lambda b: b.embeddings(body, req)
            )
        return self.get(body.model).embeddings(body, req)

    def relayed(self, req: Request, path: str) -> HandlerResult | None:
        """The answer of the upstream of the body's ``"model"``, ``req`` relayed undecoded
        to its ``path``, when that model is relayed; None otherwise."""
        backend = self._forwarder(req)
        return backend.forward(req, path) if backend is not None else None

    def count_tokens(
        self,
        req: Request,
        decode: Callable[[Request], ChatRequest],
        path: str,
        answer: Callable[[int], Response],
    ) -> HandlerResult:
        """Serve a token count of a chat request's prompt (``decode``: the API's decode;
        ``path``: the upstream route a relay sends it to; ``answer``: the count in the
        API's shape)."""
        backend = self._forwarder(req)
        if backend is not None:
            return backend.forward(req, path)
        chat = decode(req)
        if self._loadable(chat.model):
            return self._after_load(
                chat.model, req, path, lambda b: self._count(b, chat, req, answer)
            )
        return self._count(self.get(chat.model), chat, req, answer)

    def _chat(
        self, backend: Backend, api: FrontEnd, chat: ChatRequest, req: Request
    ) -> HandlerResult:
        """``backend``'s answer to ``chat``, its images read first (a 400 naming one its
        model cannot take)."""
        if chat.images:
            return with_images(
                backend, chat, self.image_fetch, lambda: self._now(backend).chat(api, chat, req)
            )
        return backend.chat(api, chat, req)

    def _now(self, backend: Backend) -> Backend:
        """The backend serving ``backend``'s model now, looked up once more after an await
        between the first lookup and admission (an image fetch): a replace that switched
        the model meanwhile closed the old version's admission (docs/decisions/0042), so
        the request is admitted on the new version. No await follows this lookup before
        the admission. A model unloaded meanwhile keeps the old backend (its 503)."""
        return self._table.get(backend.name, backend)

    def _count(
        self,
        backend: Backend,
        chat: ChatRequest,
        req: Request,
        answer: Callable[[int], Response],
    ) -> HandlerResult:
        """``backend``'s count of ``chat``'s prompt tokens, its images checked first; the
        request admitted to the model's queue as any other (a 429 past its bound), its
        ticket held until the count is answered."""
        req.admit(self.engine.model(backend.name))
        if chat.images:
            return with_images(
                backend, chat, self.image_fetch, lambda: _counted(backend, chat, answer)
            )
        return _counted(backend, chat, answer)

    def _ask_keep_alive(self, name: str, seconds: float | None) -> None:
        if seconds is None:
            return
        if self.keep_alive is None:
            raise RequestError(
                "keep_alive needs models loaded at run time (--models-dir): this server's "
                "models stay loaded",
                param="keep_alive",
            )
        self.keep_alive(name, seconds)

    # -- autoload --------------------------------------------------------------------------
    def loadable(self, name: str) -> bool:
        """Whether a request for ``name`` would load it now (a catalog model that is not
        served, with autoload on): routes that admit at the head (raw, KServe V2) then
        admit after ``wait_loaded`` instead."""
        return self._loadable(name)

    def served(
        self, name: str, req: Request, path: str, then: Callable[[Backend], HandlerResult]
    ) -> HandlerResult:
        """``then`` on ``name``'s backend, once a catalog model that a request loads (autoload)
        is loaded: the one way a route that names a model in its body reaches it
        (``path``: where a relayed model's upstream serves it)."""
        if self._loadable(name):
            return self._after_load(name, req, path, then)
        return then(self.get(name))

    async def wait_loaded(self, name: str, req: Request, timeout_s: float | None = None) -> None:
        """Load ``name`` for ``req`` (``Autoload.wait_loaded``); ``ModelNotFound`` when
        autoload is off."""
        if self.autoload is None:
            raise ModelNotFound("the requested model is not served")
        await self.autoload.wait_loaded(name, req, timeout_s)

    def _loadable(self, name: str) -> bool:
        return (
            self.autoload is not None and name not in self._table and self.autoload.can_load(name)
        )

    async def _after_load(
        self, name: str, req: Request, path: str, then: Callable[[Backend], HandlerResult]
    ) -> Response | StreamResponse:
        """Wait for ``name``'s load, then serve the request on its backend (a relay's
        undecoded, as ``_forwarder`` would have)."""
        assert self.autoload is not None
        edge = req.edge
        since = edge.load_waiting() if edge is not None else 0.0
        try:
            await self.autoload.wait_loaded(name, req)
        finally:
            if edge is not None:
                edge.load_waited(since)
        backend = self.get(name)
        if backend.forwards:
            req.admit(self.engine.model(name))
            result = backend.forward(req, path)
        else:
            result = then(backend)
        if inspect.isawaitable(result):
            return await result
        return result

    # -- lifecycle -------------------------------------------------------------------------
    def statistics(self) -> dict[str, BackendStatistics]:
        return {name: b.statistics() for name, b in self._table.items()}

    def _upstreams(self) -> dict[str, UpstreamStatistics]:
        return {k: v for b in self._table.values() for k, v in b.statistics().upstreams.items()}

    async def aclose(self) -> None:
        metrics.unregister_source("upstream")
        for name in list(self._table):
            await self.remove(name)


async def _counted(
    backend: Backend, chat: ChatRequest, answer: Callable[[int], Response]
) -> Response:
    return answer(await backend.prompt_tokens(chat))
