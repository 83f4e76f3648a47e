"""``POST /models/pull``: fetch a model into the cache and add it to the catalog
(docs/models.md, "Pulling models"; why this shape:
docs/decisions/0052-pull-route-and-model-toml-sources.md).

Admin only (``access.py``), and only on a server started with ``--allow-pull``: without
it the route answers 403 ``pull_disabled`` naming the flag, and nothing is fetched. The
body names a pull source, never a path: ``hf:ORG/REPO[:FILE_OR_QUANT]`` or an
``https://`` URL (plain ``http://`` is refused by the pull itself), with an optional
``?sha256=`` pin. The fetch runs in a thread under the manager's ``PullGate`` (one per
source, ``MAX_PULLS`` at once); the answer comes once the file is checked and the model
is in the catalog, ``unloaded`` (a load, or a request with ``--autoload``, serves it).
A file the catalog already serves under that name (the cache's own entry, docs/models.md,
"Pulled models in the catalog") is not added twice: the pull answers success. The name
(``name``, else the file's) is written to the cache's name index (``models/cache.py``,
``name_file``; in a thread: it takes a lock and syncs a file), so a server that serves the
cache serves the model under it after a restart too.
"""

from __future__ import annotations

import asyncio

from msgspec import UNSET

from ...errors import (
    Conflict,
    Forbidden,
    NotFound,
    RequestError,
    SpecError,
    UpstreamError,
    ZeroserveError,
)
from ...models.cache import MODEL_NAME, check_model_name, name_file, parse_source
from ...models.catalog import CatalogEntry
from ...models.loader import parse_spec
from ...runtime.model_manager import ModelManager
from ..openai.schemas import decode
from ..request import Request
from ..response import JSON, Response
from . import schemas as c
from .access import require_admin

PULL_DISABLED = (
    "pulling models is off: start the server with --allow-pull to let an admin pull "
    "hf: and https:// sources into the cache"
)
_pull_request = c.decoder(c.PullRequest)


async def router_pull(req: Request, manager: ModelManager, keyed: bool) -> Response:
    require_admin(req, keyed)
    gate = manager.pulls
    if gate is None:
        raise Forbidden(PULL_DISABLED, code="pull_disabled")
    body = decode(_pull_request, req.body)
    parse_source(body.model)  # 400 naming a bad source before anything is fetched
    if body.name is not UNSET:
        check_model_name(body.name)  # 400 naming a bad name before anything is fetched
    try:
        path = await gate.fetch(body.model)
    except ZeroserveError:
        raise  # a bad source or choice, a wrong pin (400), a cut download (502)
    except Exception as exc:  # the hub client's own errors
        if _hub_status(exc) == 404:
            raise NotFound(
                f"{body.model} is not on the hub", code="pull_source_not_found"
            ) from None
        raise UpstreamError(
            f"pulling {body.model} failed ({type(exc).__name__}): the hub did not answer or "
            "the download stopped; pull again to resume"
        ) from None
    name = body.name if body.name is not UNSET else path.stem
    if not MODEL_NAME.match(name):
        raise RequestError(f'the file {path.name!r} makes no model name: give "name"')
    entry = CatalogEntry(
        ref=parse_spec(f"{name}=llamacpp:{path}"), origin=f"POST /models/pull {body.model}"
    )
    held = manager.entries().get(name)
    if held is None or held.ref != entry.ref:
        try:
            manager.add(entry)
        except SpecError as exc:
            raise Conflict(exc.message, code="model_exists") from None
    await asyncio.to_thread(name_file, name, path, body.model)
    answer = c.PullAnswer(success=True, model=name)
    return Response(200, [c.encoder.encode(answer)], content_type=JSON)


def _hub_status(exc: BaseException | None) -> int | None:
    """The HTTP status behind a hub client's error: its own, or a cause's (a 404 at the
    hub reads as "not in the local cache either")."""
    seen = 0
    while exc is not None and seen < 8:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
