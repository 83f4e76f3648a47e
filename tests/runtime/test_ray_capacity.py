"""What admission and ``/ready`` say about a Ray model whose workers cannot take work
(docs/decisions/0025-abandoned-work-grace-starts-at-abandonment.md), without a cluster:
the executors are built as the engine builds them and their workers' states set as the
supervisor and the Serve status reads set them.

* ``executor=ray``: refused with 503 "restarting" while every actor is down, served as
  soon as one is up.
* ``executor=ray-serve``: refused only when a status read that answered shows no running
  replica and ``min_replicas`` > 0; a deployment scaled to zero takes requests (reaching
  its handle scales it up), and a failed read refuses nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray")

from zeroserve import errors
from zeroserve.models.echo import EchoModel
from zeroserve.runtime import ManualClock, RuntimeOptions
from zeroserve.runtime.arena import Arena
from zeroserve.runtime.handle import ModelHandle, ModelRuntime
from zeroserve.runtime.options import ResolvedModel
from zeroserve.runtime.ray.executor import RayExecutor
from zeroserve.runtime.ray.roster import RayWorkerHandle
from zeroserve.runtime.ray.serve.deployment import DeploymentHealth
from zeroserve.runtime.ray.serve.ingress import ServeFleet, serve_executor


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(1 << 20)
    yield a
    a.close()


def spec(executor: str, workers: int, **placement: Any) -> ResolvedModel:
    return ResolvedModel(
        name="m",
        factory=EchoModel,
        options={},
        executor=executor,  # type: ignore[arg-type]
        max_batch_size=1,
        max_batch_delay_ms=0.0,
        workers=workers,
        queue_depth=8,
        capabilities=EchoModel.capabilities(),
        deadline_s=300.0,
        placement=placement,
    )


def handle(ex: RayExecutor) -> tuple[ModelRuntime, ModelHandle]:
    rt = ModelRuntime(
        ex.spec, EchoModel(), ex, clock=ManualClock(), options=RuntimeOptions(hang_grace_s=0.2)
    )
    return rt, ModelHandle(rt)


def refused(h: ModelHandle) -> errors.ZeroserveError:
    with pytest.raises(errors.ZeroserveError) as info:
        h.admit()
    return info.value


def test_actors_all_down_refuse_at_the_head_until_one_is_up(arena: Arena) -> None:
    async def main() -> None:
        ex = RayExecutor(spec("ray", 2), arena, RuntimeOptions(hang_grace_s=0.2))
        ex.roster.handles.extend(RayWorkerHandle(i, None) for i in range(2))
        rt, h = handle(ex)
        # Both restarting (reclaimed, or crashed): no capacity, a 503 with a reason.
        assert not ex.has_capacity() and not ex.ready()
        err = refused(h)
        assert (err.status, err.code) == (503, "worker_failed")
        assert (b"retry-after", b"1") in err.headers
        assert "2 of 2 Ray actors restarting" in err.message
        assert rt.status().reason == err.message
        assert h.statistics().queue.in_flight == 0
        # One back: requests are admitted again, and the reason is gone.
        ex.roster.handles[1].ready = True
        assert ex.has_capacity() and rt.refusal() is None and rt.status().reason is None
        h.admit().release()
        # A lost cluster says so, whatever the actors' state.
        ex.roster.cluster_up = False
        assert refused(h).code == "cluster_unavailable"

    asyncio.run(main())


@pytest.mark.parametrize(
    ("min_replicas", "read", "refuses"),
    [
        (1, DeploymentHealth(False, 1, 0), True),  # Serve is replacing its replica
        (1, DeploymentHealth(True, 1, 1), False),
        (0, DeploymentHealth(True, 0, 0), False),  # scaled to zero: the handle scales up
        (1, RuntimeError("controller gone"), False),  # a failed read proves nothing
    ],
    ids=["replacing", "running", "scaled-to-zero", "failed-read"],
)
def test_serve_refuses_only_when_a_read_shows_no_replica_running(
    arena: Arena, min_replicas: int, read: DeploymentHealth | Exception, refuses: bool
) -> None:
    async def main() -> None:
        ex = serve_executor(
            spec("ray-serve", 1, min_replicas=min_replicas), arena, RuntimeOptions()
        )
        fleet = ex.fleet
        assert isinstance(fleet, ServeFleet)
        w = RayWorkerHandle(0, None, linkable=False)
        w.ready = True
        ex.roster.handles.append(w)
        rt, h = handle(ex)
        assert ex.has_capacity()  # serve.run returned: a replica runs
        reading: asyncio.Future[DeploymentHealth] = asyncio.get_running_loop().create_future()
        if isinstance(read, Exception):
            reading.set_exception(read)
        else:
            reading.set_result(read)
        fleet._health_read(reading)  # what a status read that ended hands over
        if refuses:
            err = refused(h)
            assert (err.status, err.code) == (503, "worker_failed")
            assert (b"retry-after", b"1") in err.headers
            assert "no running replica" in err.message
            assert rt.status().reason == err.message
        else:
            assert rt.refusal() is None
            h.admit().release()
        # A later read showing a running replica takes requests again.
        again: asyncio.Future[DeploymentHealth] = asyncio.get_running_loop().create_future()
        again.set_result(DeploymentHealth(True, 1, 1))
        fleet._health_read(again)
        assert rt.refusal() is None

    asyncio.run(main())
