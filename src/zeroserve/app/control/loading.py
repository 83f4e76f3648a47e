"""A request's load on demand, and a model's status as clients read it
(docs/architecture.md, "Models at run time").

``ManagerAutoload`` is the backend table's ``Autoload``: a request that names a catalog
model that is not loaded waits for its load (one load, however many requests ask), for
at most the request's own timeout (the SDK's ``X-Stainless-Timeout``, the raw route's
``?timeout=`` or ``Request-Timeout``) or the server's
``--request-timeout``. What the wait cannot give is a 503 with ``Retry-After``: still
loading when the time ran out, no room came under ``--models-max`` / ``--models-memory``
in that time, too many requests already wait for the load (the model's queue depth), or
the load failed (with its reason; it is tried again after ``FAILED_RETRY_S``).
"""

from __future__ import annotations

from ...errors import ModelLoadError, Overloaded, SpecError
from ...runtime import Engine
from ...runtime.admission import DEFAULT_RETRY_AFTER_S
from ...runtime.model_manager import ModelManager
from ...runtime.model_state import ModelState, ModelStateSnapshot
from ..deadlines import openai_timeout
from ..openai.schemas import ModelLoadStatus
from ..request import Request


def load_status(snapshot: ModelStateSnapshot) -> ModelLoadStatus:
    """A state in llama.cpp router's shape (a failed model is ``unloaded``, ``failed``;
    a loaded one whose engine process died is ``loaded``, ``failed``, until a new one
    serves)."""
    if snapshot.state is ModelState.FAILED:
        return ModelLoadStatus(value="unloaded", failed=True, reason=snapshot.reason or "")
    if snapshot.fault is not None:
        return ModelLoadStatus(value="loaded", failed=True, reason=snapshot.fault)
    return ModelLoadStatus(value=snapshot.state.value, replacing=snapshot.replacing)  # type: ignore[arg-type]


class ManagerAutoload:
    """Loads a catalog model for the request that names it (``--autoload``)."""

    def __init__(self, manager: ModelManager, engine: Engine) -> None:
        self.manager = manager
        self.engine = engine

    def can_load(self, name: str) -> bool:
        return name in self.manager.entries()

    async def wait_loaded(self, name: str, req: Request, timeout_s: float | None = None) -> None:
        wait_s = self.engine.options.default_deadline_s
        asked = openai_timeout(req) if timeout_s is None else timeout_s
        if asked is not None:
            wait_s = min(wait_s, asked)
        try:
            await self.manager.ensure(name, wait_s)
        except TimeoutError:
            raise Overloaded(
                f"model {name!r} is still loading; try again shortly",
                status=503,
                retry_after=DEFAULT_RETRY_AFTER_S,
            ) from None
        except (ModelLoadError, SpecError) as exc:
            cause = exc.cause if isinstance(exc, ModelLoadError) else exc.message
            raise Overloaded(
                f"model {name!r} could not be loaded: {cause}",
                status=503,
                retry_after=self.manager.retry_after(name),
            ) from None
