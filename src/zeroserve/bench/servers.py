"""The servers under test: zeroserve (the subject) and the peers, as command lines.

Each is started as its own process serving 127.0.0.1 on one port, pinned to the server
CPU. Peers join only when their framework is importable.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUBJECT = "zeroserve"
BASELINE = "fastapi"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    title: str                                 # shown in tables
    argv: Callable[[int], list[str]]           # port -> command line
    requires: tuple[str, ...]                  # importable modules it needs
    scrape_metrics: bool = False               # read /metrics for copy accounting

    def missing(self) -> str | None:
        """Why it cannot run here, or None."""
        for mod in self.requires:
            try:
                found = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{mod} is not importable"
        return None


def _zeroserve_argv(extra: list[str]) -> Callable[[int], list[str]]:
    script = Path(sys.executable).parent / "zeroserve"

    def argv(port: int) -> list[str]:
        base = [str(script)] if script.exists() else [
            sys.executable, "-c", "import sys; from zeroserve.cli import main; sys.exit(main())"]
        return [*base, "serve", "--host", "127.0.0.1", "--port", str(port), *extra]

    return argv


def _peer_argv(module: str) -> Callable[[int], list[str]]:
    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", f"zeroserve.bench.peers.{module}", "--port", str(port)]

    return argv


def all_servers(zeroserve_args: list[str]) -> list[ServerSpec]:
    """Every known server, subject first then the baseline (the A B A B order)."""
    return [
        ServerSpec(SUBJECT, "zeroserve", _zeroserve_argv(zeroserve_args), ("zeroserve.cli",),
                   scrape_metrics=True),
        ServerSpec(BASELINE, "FastAPI+uvicorn", _peer_argv("fastapi_app"),
                   ("fastapi", "uvicorn", "uvloop", "httptools")),
        ServerSpec("granian", "granian RSGI", _peer_argv("granian_app"), ("granian",)),
        ServerSpec("aiohttp", "aiohttp", _peer_argv("aiohttp_app"), ("aiohttp",)),
    ]
