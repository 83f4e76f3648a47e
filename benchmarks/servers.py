"""The servers under test, as one type: :class:`Server` (a command line and how to tell
it is up), the subject zeroserve, the peers in this directory, and the external peers
that live in their own virtual environments.

Each is started as its own process serving 127.0.0.1 on one port, pinned to the server
CPU (:func:`started`); a gateway's upstream is started first, on the auxiliary CPU, and
its port passed to the gateway's command line. A server joins a suite only when
:meth:`Server.missing` says nothing is missing.

External peers (never installed into the project's venv; ``make bench-peers``):

* MLServer: ``/tmp/mlserver-venv`` with ``mlserver`` (or ``$ZSBENCH_MLSERVER_VENV``),
  serving an identity model written here.
* Triton through PyTriton: ``/usr/bin/python3.11 -m venv /tmp/pytriton-venv`` (the system
  interpreter: the Python backend stub links the system libpython3.11) with
  ``nvidia-pytriton`` (``$ZSBENCH_PYTRITON_VENV``).
* LiteLLM's proxy: ``/tmp/litellm-venv`` with ``litellm[proxy]``
  (``$ZSBENCH_LITELLM_VENV``), offline, relaying to the same loopback upstream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .machine import Pinning
from .procs import LOOPBACK, READY_TIMEOUT_S, ServerProcess, free_port, start_server

SUBJECT = "zeroserve"
BASELINE = "fastapi"
# MLServer, LiteLLM and Triton take far longer than a Python peer to start.
EXTERNAL_READY_TIMEOUT_S = 120.0
# The echo model the comparative suites serve. Its admission queue is raised from the
# default (64) to 1024: W2 runs 256 concurrent streams plus a probe, and the peers have
# no admission limit, so at the default depth zeroserve would answer most of that load
# with fast 429s instead of streams.
ECHO = "echo=zeroserve.models.echo:EchoModel?queue_depth=1024"

# Seconds openssl may take to make the benchmark's certificate.
OPENSSL_TIMEOUT_S = 60

# port, upstream port (a gateway's), work directory -> the command line.
Argv = Callable[[int, int | None, Path], list[str]]


def _nothing_missing() -> str | None:
    return None


@dataclass(frozen=True)
class Server:
    name: str
    title: str  # shown in tables
    argv: Argv
    health: str = "/health"
    env: Callable[[int], dict[str, str]] | None = None
    upstream: Server | None = None
    scrape_metrics: bool = False  # read /metrics for copy accounting
    tls: bool = False  # serves HTTPS with the run's certificate (``bench_certs``)
    ready_timeout_s: float = READY_TIMEOUT_S
    missing: Callable[[], str | None] = _nothing_missing  # why it cannot run here


def importable(*modules: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        for mod in modules:
            try:
                found = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{mod} is not importable"
        return None

    return missing


def zeroserve_cmd() -> list[str]:
    script = Path(sys.executable).parent / "zeroserve"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "zeroserve"]


def zeroserve(
    *models: str,
    name: str = SUBJECT,
    title: str = "zeroserve",
    upstream: Server | None = None,
    extra: tuple[str, ...] = (),
) -> Server:
    """zeroserve serving ``models`` (specs; ``{up}`` is replaced by the upstream's port),
    then ``extra`` arguments for ``zeroserve serve``."""

    def argv(port: int, up: int | None, work: Path) -> list[str]:
        args = [*zeroserve_cmd(), "serve", "--host", LOOPBACK, "--port", str(port)]
        for m in models:
            args += ["--model", m.replace("{up}", str(up))]
        return [*args, *extra]

    return Server(
        name,
        title,
        argv,
        upstream=upstream,
        scrape_metrics=True,
        missing=importable("zeroserve.cli"),
    )


def models_dir_argv(models: Path) -> Argv:
    """``zeroserve serve --models-dir MODELS``: models loaded on request and kept an hour
    (no idle unload within a suite), no playground."""

    def argv(port: int, up: int | None, work: Path) -> list[str]:
        return [
            *zeroserve_cmd(),
            "serve",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--models-dir",
            str(models),
            "--keep-alive",
            "1h",
            "--no-ui",
        ]

    return argv


def peer(module: str, name: str, title: str, requires: tuple[str, ...], *extra: str) -> Server:
    """One of this directory's peers (``benchmarks/peers/MODULE.py``)."""

    def argv(port: int, up: int | None, work: Path) -> list[str]:
        return [sys.executable, "-m", f"benchmarks.peers.{module}", "--port", str(port), *extra]

    return Server(name, title, argv, missing=importable(*requires))


def bench_certs(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1 (RSA 2048, PKCS#8 as granian
    wants), made once per results directory with the openssl CLI."""
    cert, key = work / "bench-cert.pem", work / "bench-key.pem"
    if not (cert.exists() and key.exists()):
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
                *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
            ],
            check=True,
            capture_output=True,
            timeout=OPENSSL_TIMEOUT_S,
        )
    return cert, key


def with_tls(srv: Server, cert_flag: str, key_flag: str, *, name: str, title: str) -> Server:
    """``srv`` serving HTTPS: its command line plus ``cert_flag CERT key_flag KEY``."""
    plain = srv.argv

    def argv(port: int, up: int | None, work: Path) -> list[str]:
        cert, key = bench_certs(work)
        return [*plain(port, up, work), cert_flag, str(cert), key_flag, str(key)]

    def missing() -> str | None:
        if shutil.which("openssl") is None:
            return "the openssl CLI is not installed (it makes the certificate)"
        return srv.missing()

    return dataclasses.replace(srv, name=name, title=title, argv=argv, tls=True, missing=missing)


def fastapi_peer(*extra: str, title: str = "FastAPI+pydantic") -> Server:
    return peer("fastapi_app", BASELINE, title, ("fastapi", "uvicorn"), *extra)


# An A/B of zeroserve against itself: with ZSBENCH_BASELINE_SRC naming another checkout's
# ``src/`` (for example ``git worktree add /tmp/base REV``), W1/W2 also run "zeroserve@base"
# from that tree in the same rounds, so a change is measured against its parent under the
# same background noise rather than against a number from another day.
BASELINE_SRC_ENV = "ZSBENCH_BASELINE_SRC"
SELF_BASELINE = "zeroserve-base"  # never a peer in the targets: it is ourselves


def at_baseline(server: Server, name: str, title: str) -> Server | None:
    """``server`` (a zeroserve) run from ``ZSBENCH_BASELINE_SRC`` instead, as ``name``;
    None when the variable is not set."""
    src = os.environ.get(BASELINE_SRC_ENV)
    if not src:
        return None
    base_src = str(Path(src).resolve())

    def env(port: int) -> dict[str, str]:
        return {"PYTHONPATH": base_src}

    def missing() -> str | None:
        if not (Path(base_src) / "zeroserve" / "cli.py").exists():
            return f"{base_src}/zeroserve/cli.py not found ({BASELINE_SRC_ENV})"
        return None

    return dataclasses.replace(server, name=name, title=title, env=env, missing=missing)


def zeroserve_baseline(zeroserve_args: tuple[str, ...]) -> Server | None:
    return at_baseline(zeroserve(extra=zeroserve_args), SELF_BASELINE, "zeroserve@base")


def comparative(zeroserve_args: tuple[str, ...]) -> list[Server]:
    """W1/W2's servers, subject first then the baseline (the A B A B order)."""
    base = zeroserve_baseline(zeroserve_args)
    return [
        zeroserve(extra=zeroserve_args),
        *([base] if base is not None else []),
        fastapi_peer(title="FastAPI+uvicorn"),
        peer("granian_app", "granian", "granian RSGI", ("granian",)),
        peer("aiohttp_app", "aiohttp", "aiohttp", ("aiohttp",)),
    ]


def _venv(env: str, default: str) -> Path:
    return Path(os.environ.get(env, default))


MLSERVER_VENV = _venv("ZSBENCH_MLSERVER_VENV", "/tmp/mlserver-venv")
PYTRITON_VENV = _venv("ZSBENCH_PYTRITON_VENV", "/tmp/pytriton-venv")
LITELLM_VENV = _venv("ZSBENCH_LITELLM_VENV", "/tmp/litellm-venv")


def _venv_missing(venv: Path, exe: str, how: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        if not (venv / "bin" / exe).exists():
            return f"{venv}/bin/{exe} not found ({how})"
        return None

    return missing


_MLSERVER_MODEL = '''\\
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class Identity(MLModel):
    """Every input back as an output of the same name, datatype, shape and data."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name=t.name, datatype=t.datatype, shape=t.shape,
                                    data=t.data) for t in payload.inputs],
        )
'''


def mlserver() -> Server:
    def argv(port: int, up: int | None, work: Path) -> list[str]:
        model_dir = work / "mlserver-models" / "echo"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "identity.py").write_text(_MLSERVER_MODEL)
        (model_dir / "model-settings.json").write_text(
            json.dumps({"name": "echo", "implementation": "identity.Identity"})
        )
        return [str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(model_dir.parent)]

    def env(port: int) -> dict[str, str]:
        return {
            "MLSERVER_HOST": LOOPBACK,
            "MLSERVER_HTTP_PORT": str(port),
            "MLSERVER_GRPC_PORT": str(free_port()),
            "MLSERVER_METRICS_PORT": str(free_port()),
            "MLSERVER_METRICS_ENDPOINT": "",
            # One process, like every other server here (the default adds a worker pool).
            "MLSERVER_PARALLEL_WORKERS": "0",
            "MLSERVER_LOGGING_LEVEL": "WARNING",
        }

    return Server(
        "mlserver",
        "MLServer (identity)",
        argv,
        health="/v2/models/echo/ready",
        env=env,
        ready_timeout_s=EXTERNAL_READY_TIMEOUT_S,
        missing=_venv_missing(MLSERVER_VENV, "mlserver", "pip install mlserver into that venv"),
    )


_PYTRITON_SCRIPT = """\\
import sys

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

port, grpc, metrics = (int(a) for a in sys.argv[1:4])


def identity(requests):
    return [{"INPUT0": r["INPUT0"]} for r in requests]


config = TritonConfig(http_address="127.0.0.1", http_port=port, grpc_address="127.0.0.1",
                      grpc_port=grpc, metrics_port=metrics, allow_metrics=False)
with Triton(config=config) as triton:
    triton.bind(model_name="echo", infer_func=identity,
                inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(-1,))],
                config=ModelConfig(batching=False))
    triton.serve()
"""


def pytriton() -> Server:
    def argv(port: int, up: int | None, work: Path) -> list[str]:
        script = work / "pytriton_identity.py"
        script.write_text(_PYTRITON_SCRIPT)
        return [
            str(PYTRITON_VENV / "bin" / "python"),
            str(script),
            str(port),
            str(free_port()),
            str(free_port()),
        ]

    return Server(
        "triton",
        "Triton (PyTriton identity)",
        argv,
        health="/v2/models/echo/ready",
        ready_timeout_s=EXTERNAL_READY_TIMEOUT_S,
        missing=_venv_missing(
            PYTRITON_VENV, "python", "pip install nvidia-pytriton into that venv"
        ),
    )


def litellm(upstream: Server) -> Server:
    def argv(port: int, up: int | None, work: Path) -> list[str]:
        cfg = work / f"litellm-{port}.yaml"
        cfg.write_text(
            "model_list:\n"
            "  - model_name: gw\n"
            "    litellm_params:\n"
            "      model: openai/echo\n"
            f"      api_base: http://{LOOPBACK}:{up}/v1\n"
            "      api_key: none\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n"
        )
        return [
            str(LITELLM_VENV / "bin" / "litellm"),
            "--config",
            str(cfg),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--num_workers",
            "1",
        ]

    def env(port: int) -> dict[str, str]:
        # Offline: the bundled model cost map, no telemetry, no update checks. No master
        # key (no authentication), like the zeroserve gateway here: LiteLLM's cheapest path.
        return {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "True",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }

    return Server(
        "litellm",
        "LiteLLM proxy",
        argv,
        health="/health/liveliness",
        env=env,
        upstream=upstream,
        ready_timeout_s=EXTERNAL_READY_TIMEOUT_S,
        missing=_venv_missing(
            LITELLM_VENV, "litellm", "pip install 'litellm[proxy]' into that venv"
        ),
    )


def start(
    srv: Server, pins: Pinning, results_dir: Path, cpu: int | None = None, up: int | None = None
) -> ServerProcess:
    """Start one server (no upstream) on a free port, pinned to ``cpu`` (default: the
    server CPU), and return once its health path answers 200."""
    work = results_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return start_server(
        srv.name,
        srv.argv(port, up, work),
        port,
        results_dir / "logs",
        pins.server_cpu if cpu is None else cpu,
        env=srv.env(port) if srv.env else None,
        health=srv.health,
        ready_timeout_s=srv.ready_timeout_s,
        tls=srv.tls,
    )


@contextlib.contextmanager
def started(srv: Server, pins: Pinning, results_dir: Path) -> Iterator[ServerProcess]:
    """Start the upstream (if any, on the auxiliary CPU) then the server; stop both, by
    PID, on the way out."""
    procs: list[ServerProcess] = []
    try:
        up_port = None
        if srv.upstream is not None:
            procs.append(start(srv.upstream, pins, results_dir, cpu=pins.aux_cpu))
            up_port = procs[-1].port
        procs.append(start(srv, pins, results_dir, up=up_port))
        yield procs[-1]
    finally:
        for p in reversed(procs):
            p.stop()
