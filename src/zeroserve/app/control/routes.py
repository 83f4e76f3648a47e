"""The model control routes (docs/architecture.md, "Models at run time").

==========================================  ==============================================
``GET  /models``                            the catalog with states (llama.cpp router's)
``POST /models/load {"model": NAME}``       load a catalog model; ``{"success": true}``
``POST /models/unload {"model": NAME}``     unload it once its admitted work is done
``POST /models/pull {"model": SOURCE}``      pull into the cache (``--allow-pull``)
``POST /v2/repository/index``               rescan ``--models-dir``; the index, Triton's
``POST /v2/repository/models/{m}/load``     load (KServe V2 repository extension)
``POST /v2/repository/models/{m}/unload``   unload
==========================================  ==============================================

Every POST is admin only (``access.py``); ``GET /models`` says no more than
``/v1/models``. A load names a catalog entry: a configuration or files sent with it are
refused (400), and nothing named by a request is ever opened. An unknown name is a 404
naming it; a pinned model (every ``--model``) is not unloaded (409); a load that fails
is a 500 with its reason, the model then ``failed`` while every other model serves.
A load answers once the model serves (llama.cpp answers at once and loads behind: a
client that polls ``/models`` sees the same states either way).
"""

from __future__ import annotations

from msgspec import UNSET

from ...errors import Conflict, ModelLoadError, Overloaded, SpecError, ZeroserveError
from ...runtime.admission import DEFAULT_RETRY_AFTER_S
from ...runtime.model_manager import ModelManager
from ...runtime.model_state import TRITON_STATE, ModelState
from ..openai.schemas import decode
from ..request import Request
from ..response import JSON, Response
from ..router import RouteDoc, Router
from . import schemas as c
from .access import require_admin
from .loading import load_status
from .pulling import router_pull

_router_request = c.decoder(c.RouterModelRequest)
_index_request = c.decoder(c.RepositoryIndexRequest)
_load_request = c.decoder(c.RepositoryLoadRequest)
_unload_request = c.decoder(c.RepositoryUnloadRequest)
# The one version of every model (app/kserve/routes.py: models have version "1").
VERSION = "1"


def _json(obj: object) -> Response:
    return Response(200, [c.encoder.encode(obj)], content_type=JSON)


class ModelControl:
    """The handlers, over one manager; ``keyed``: the server has API keys."""

    def __init__(self, manager: ModelManager, keyed: bool) -> None:
        self.manager = manager
        self.keyed = keyed

    # -- llama.cpp router --------------------------------------------------------------
    def list_models(self, req: Request) -> Response:
        entries = self.manager.entries()
        data = [
            c.RouterModel(
                id=name,
                object="model",
                owned_by="zeroserve",
                status=load_status(snapshot),
                pinned=entries[name].pin,
            )
            for name, snapshot in self.manager.statuses().items()
        ]
        return _json(c.RouterModelList(object="list", data=data))

    async def router_load(self, req: Request) -> Response:
        require_admin(req, self.keyed)
        await self.load(decode(_router_request, req.body).model)
        return _json(c.RouterAnswer(success=True))

    async def router_pull(self, req: Request) -> Response:
        return await router_pull(req, self.manager, self.keyed)

    async def router_unload(self, req: Request) -> Response:
        require_admin(req, self.keyed)
        await self.unload(decode(_router_request, req.body).model)
        return _json(c.RouterAnswer(success=True))

    # -- KServe V2 repository extension ------------------------------------------------
    async def index(self, req: Request) -> Response:
        require_admin(req, self.keyed)
        ready = decode(_index_request, req.body).ready if len(req.body) else False
        if self.manager.can_refresh():
            await self.manager.refresh()
        out: list[c.RepositoryModel] = []
        for name, snapshot in self.manager.statuses().items():
            loaded = snapshot.state is ModelState.LOADED
            if ready and (not loaded or snapshot.fault is not None):
                continue
            why = snapshot.reason or snapshot.fault  # a dead engine process: UNAVAILABLE
            state = "UNAVAILABLE" if snapshot.fault else TRITON_STATE[snapshot.state]
            out.append(
                c.RepositoryModel(
                    name=name,
                    state=state,  # type: ignore[arg-type]
                    version=VERSION if loaded else UNSET,
                    reason=why if why is not None else UNSET,
                )
            )
        return _json(out)

    async def repository_load(self, req: Request) -> Response:
        require_admin(req, self.keyed)
        if len(req.body):
            decode(_load_request, req.body)  # 400 for a config or files: never used
        await self.load(req.params["model"])
        return Response(200)

    async def repository_unload(self, req: Request) -> Response:
        require_admin(req, self.keyed)
        if len(req.body):
            decode(_unload_request, req.body)
        await self.unload(req.params["model"])
        return Response(200)

    # -- both --------------------------------------------------------------------------
    async def load(self, name: str) -> None:
        try:
            # ModelNotFound (404) naming an unknown name; Overloaded (503) when no room
            # came within the server's request deadline.
            await self.manager.load(name, self.manager.default_wait_s)
        except TimeoutError:
            raise Overloaded(
                f"model {name!r} is still loading; try again shortly",
                status=503,
                retry_after=DEFAULT_RETRY_AFTER_S,
            ) from None
        except (ModelLoadError, SpecError) as exc:
            cause = exc.cause if isinstance(exc, ModelLoadError) else exc.message
            raise ZeroserveError(
                f"model {name!r} could not be loaded: {cause}", code="model_load_failed"
            ) from None

    async def unload(self, name: str) -> None:
        entry = self.manager.entries().get(name)
        if entry is not None and entry.pin:
            raise Conflict(
                f"model {name!r} is pinned (a --model, or pin = true): it stays loaded",
                code="model_pinned",
            )
        await self.manager.unload(name)


def register(router: Router, manager: ModelManager, keyed: bool) -> None:
    api = ModelControl(manager, keyed)
    add = router.add
    add(
        "GET",
        "/models",
        api.list_models,
        doc=RouteDoc("The model catalog with states (llama.cpp router)", None, c.RouterModelList),
    )
    add(
        "POST",
        "/models/load",
        api.router_load,
        doc=RouteDoc(
            "Load a catalog model (admin; llama.cpp router)", c.RouterModelRequest, c.RouterAnswer
        ),
    )
    add(
        "POST",
        "/models/unload",
        api.router_unload,
        doc=RouteDoc(
            "Unload a model once its work is done (admin; llama.cpp router)",
            c.RouterModelRequest,
            c.RouterAnswer,
        ),
    )
    add(
        "POST",
        "/models/pull",
        api.router_pull,
        doc=RouteDoc(
            "Pull hf:/https:// into the cache and the catalog (admin; --allow-pull)",
            c.PullRequest,
            c.PullAnswer,
        ),
    )
    add(
        "POST",
        "/v2/repository/index",
        api.index,
        errors="kserve",
        doc=RouteDoc(
            "Rescan the models directory; the repository index (admin; KServe V2)",
            c.RepositoryIndexRequest,
            list[c.RepositoryModel],
        ),
    )
    add(
        "POST",
        "/v2/repository/models/{model}/load",
        api.repository_load,
        errors="kserve",
        doc=RouteDoc("Load a catalog model (admin; KServe V2)", c.RepositoryLoadRequest),
    )
    add(
        "POST",
        "/v2/repository/models/{model}/unload",
        api.repository_unload,
        errors="kserve",
        doc=RouteDoc(
            "Unload a model once its work is done (admin; KServe V2)", c.RepositoryUnloadRequest
        ),
    )
