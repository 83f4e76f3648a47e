"""The Ray suite's module-scoped two-node cluster (see ``cluster``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ray")

from tests.ray.cluster import RayCluster, ray_cluster_fixture


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    yield from ray_cluster_fixture(tmp_path_factory)
