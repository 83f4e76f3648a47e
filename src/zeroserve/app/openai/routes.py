"""The OpenAI-compatible API's routes: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses`` and ``/v1/embeddings``.

Each route is one line over the backend table (``app/backends``): the model named in the
body decides the backend once, and its front end (``chat.py``, ``responses.py``) decodes
and answers. Errors use OpenAI's ``{"error": {...}}`` body (the routes' ``errors=
"openai"``) and never echo the input. The model name is in the body, so the model lookup
(404) and admission (429) happen when the body is complete, before any work: one ticket
per choice, all taken up front.
"""

from __future__ import annotations

import time

from ...errors import ModelNotFound
from ...runtime import Engine
from ...runtime.model_manager import ModelManager
from ...runtime.model_state import ModelState
from ..backends import Backends
from ..chat.request import OPTIONAL_PARAMETERS
from ..control.loading import load_status
from ..limits import ApiLimits, check_count
from ..request import Request
from ..response import JSON, HandlerResult, Response
from ..router import RouteDoc, Router
from . import contract
from . import responses_schemas as r
from . import schemas as s
from .chat import ChatCompletions, Completions
from .responses import Responses


def register(
    router: Router,
    engine: Engine,
    backends: Backends,
    limits: ApiLimits | None = None,
    models: ModelManager | None = None,
) -> None:
    api = _OpenAI(engine, backends, limits or ApiLimits(), models)
    add = router.add
    add(
        "GET",
        "/v1/models",
        api.list_models,
        doc=RouteDoc("List the served models", None, s.ModelList),
    )
    add(
        "GET",
        "/v1/models/{model}",
        api.get_model,
        doc=RouteDoc("Describe one model", None, s.ModelCard),
    )
    add(
        "POST",
        "/v1/chat/completions",
        api.chat,
        doc=RouteDoc(
            "Chat completion (OpenAI); text/event-stream when stream is true",
            s.ChatCompletionRequest,
            s.ChatCompletion,
            True,
            contract.CHAT,
        ),
    )
    add(
        "POST",
        "/v1/completions",
        api.completions,
        doc=RouteDoc(
            "Text completion (OpenAI); text/event-stream when stream is true",
            s.CompletionRequest,
            s.Completion,
            True,
            contract.COMPLETIONS,
        ),
    )
    add(
        "POST",
        "/v1/embeddings",
        api.embeddings,
        doc=RouteDoc(
            "Embeddings (OpenAI)", s.EmbeddingRequest, s.EmbeddingList, False, contract.EMBEDDINGS
        ),
    )
    add(
        "POST",
        "/v1/responses",
        api.responses,
        doc=RouteDoc(
            "Responses API (OpenAI, stateless); text/event-stream of Responses events when "
            "stream is true",
            r.ResponsesRequest,
            r.ResponseObject,
            r.EVENT_TYPES,
            contract.RESPONSES,
        ),
    )


def _json(obj: object) -> Response:
    return Response(200, [s.encoder.encode(obj)], content_type=JSON)


class _OpenAI:
    def __init__(
        self,
        engine: Engine,
        backends: Backends,
        limits: ApiLimits,
        models: ModelManager | None = None,
    ) -> None:
        self.engine = engine
        self.backends = backends
        self.models = models
        self.limits = limits
        self.created = int(time.time())
        self._chat = ChatCompletions(limits)
        self._completions = Completions(limits)
        self._responses = Responses(limits)

    # -- models ------------------------------------------------------------------------
    def _card(self, name: str) -> s.ModelCard:
        caps = self.backends.get(name).capabilities()  # 404 for a name not served
        handle = self.engine.model(name)
        meta = handle.model
        builtin = type(meta).__module__.startswith("zeroserve.")
        description = (
            meta.description or f"{type(meta).__name__} ({', '.join(sorted(handle.capabilities))})"
        )
        return s.ModelCard(
            id=name,
            object="model",
            created=self.created,
            owned_by="zeroserve" if builtin else "user",
            description=description,
            capabilities=s.ModelCapabilities(
                chat=caps.chat,
                embeddings=caps.embeddings,
                parameters=[p for p in OPTIONAL_PARAMETERS if p in caps.honours],  # type: ignore[misc]
                relayed=caps.relayed,
                context_length=caps.context_length,
                embedding_dimensions=caps.embedding_dimensions,
                token_inputs=caps.token_inputs,
                tokenizer=caps.tokenizer,
                rerank=caps.rerank,
                input_modalities=list(caps.input_modalities),  # type: ignore[arg-type]
            ),
        )

    def _catalog_card(self, name: str) -> s.ModelCard:
        """A catalog model's card with its ``status`` (llama.cpp router's shape): the
        capabilities are known once it is loaded."""
        assert self.models is not None
        snapshot = self.models.status(name)
        if snapshot.state is ModelState.LOADED and name in self.engine.names():
            card = self._card(name)
            card.status = load_status(snapshot)
            return card
        return s.ModelCard(
            id=name,
            object="model",
            created=self.created,
            owned_by="zeroserve",
            description=f"not loaded ({snapshot.state.value}): a request or POST "
            "/models/load loads it",
            status=load_status(snapshot),
        )

    def list_models(self, req: Request) -> Response:
        if self.models is None:
            cards = [self._card(name) for name in self.engine.names()]
        else:
            cards = [self._catalog_card(name) for name in self.models.entries()]
        return _json(s.ModelList(object="list", data=cards))

    def get_model(self, req: Request) -> Response:
        name = req.params["model"]
        if self.models is None:
            return _json(self._card(name))
        if name not in self.models.entries():
            raise ModelNotFound(
                "the requested model is not served here; GET /v1/models lists the models",
                param="model",
            )
        return _json(self._catalog_card(name))

    # -- the APIs ----------------------------------------------------------------------
    def chat(self, req: Request) -> HandlerResult:
        return self.backends.chat(self._chat, req)

    def completions(self, req: Request) -> HandlerResult:
        return self.backends.chat(self._completions, req)

    def responses(self, req: Request) -> HandlerResult:
        return self.backends.chat(self._responses, req)

    def embeddings(self, req: Request) -> HandlerResult:
        return self.backends.embeddings(req, self._embedding_request)

    def _embedding_request(self, req: Request) -> s.EmbeddingRequest:
        body = s.decode(s.embedding_decoder, req.body)
        if isinstance(body.input, list):
            check_count(len(body.input), self.limits.embedding_inputs, "input", "inputs")
        return body
