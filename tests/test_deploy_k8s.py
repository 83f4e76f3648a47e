"""The Kubernetes manifests in ``deploy/k8s/`` parse, have the kinds, API versions and
fields Kubernetes (and KubeRay) require, and agree with zeroserve: probe paths that
exist, a grace period that covers the drain, model specs that parse. There is no cluster
here: this is the whole check (docs/scale.md says so)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from zeroserve.models.loader import parse_spec
from zeroserve.server.options import GRACEFUL_TIMEOUT_S

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
API_VERSIONS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "RayCluster": "ray.io/v1",
}


def _docs(name: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    for doc in docs:
        assert doc["apiVersion"] == API_VERSIONS[doc["kind"]], doc["kind"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    return docs


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _check_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The serving container of a pod template: probes, drain and ports."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["name"] and container["image"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert "http" in ports
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", ports["http"])
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    (seconds,) = (float(m) for m in re.findall(r"sleep (\d+)", " ".join(sleep)))
    assert spec["terminationGracePeriodSeconds"] > seconds + GRACEFUL_TIMEOUT_S
    return container


def _served_specs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--model"]


def test_deployment_and_service() -> None:
    docs = _docs("zeroserve.yaml")
    dep, svc = _by_kind(docs, "Deployment"), _by_kind(docs, "Service")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = _check_pod(dep["spec"]["template"])
    assert container["args"][0] == "serve"
    for spec in _served_specs(container["args"]):
        parse_spec(spec)
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_hpa_targets_the_deployment_on_a_zeroserve_gauge() -> None:
    (dep,) = _docs("zeroserve.yaml")[:1]
    hpa = _by_kind(_docs("hpa.yaml"), "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (
        "apps/v1",
        "Deployment",
        dep["metadata"]["name"],
    )
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    # The adapter rule in the file's comment maps the gauge the server exports to it.
    assert "zeroserve_queue_in_flight" in (K8S / "hpa.yaml").read_text()


def test_raycluster_runs_the_ingress_in_the_ray_worker_pod() -> None:
    pytest.importorskip("ray")
    import ray

    docs = _docs("raycluster.yaml")
    rc, svc = _by_kind(docs, "RayCluster"), _by_kind(docs, "Service")
    assert rc["spec"]["rayVersion"] == ray.__version__
    head = rc["spec"]["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict) and head["template"]["spec"]["containers"]
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["groupName"] and group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    pod = group["template"]
    assert pod["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    container = _check_pod(pod)
    script = container["args"][0]
    assert "${KUBERAY_GEN_RAY_START_CMD}" in script
    argv = shlex.split(script.split("exec ", 1)[1])
    assert argv[:2] == ["zeroserve", "serve"] and "--ray-address" in argv
    specs = [parse_spec(s) for s in _served_specs(argv)]
    assert specs and all(s.runtime["executor"] == "ray" for s in specs)
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
