"""What the edge tests add to ``tests.support.ServerThread`` (which runs an ``Edge`` built by
the test, with TLS when its options ask): a clock the test moves, an access-log sink a test
waits on, and a self-signed certificate."""

from __future__ import annotations

import io
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.support import scaled

# A line the server is about to log appears within this long (quiet machine, scaled).
LOG_TIMEOUT_S = 60.0


class ManualClock:
    """The edge's clock, moved by the test (quotas refill only when it says so)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LogSink(io.BytesIO):
    """An access-log stream that wakes a waiting test whenever the writer thread writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Condition()

    def write(self, b: Any) -> int:
        with self.written:
            n = super().write(b)
            self.written.notify_all()
            return n

    def wait_for_text(self, needle: bytes, timeout: float = LOG_TIMEOUT_S) -> bytes:
        with self.written:
            assert self.written.wait_for(lambda: needle in self.getvalue(), scaled(timeout)), needle
            return self.getvalue()


class Certs:
    """A self-signed CA-less certificate for 127.0.0.1, made with the openssl CLI."""

    def __init__(self, directory: Path) -> None:
        self.cert = directory / "cert.pem"
        self.key = directory / "key.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                str(self.key),
                "-out",
                str(self.cert),
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
            timeout=scaled(60),
        )

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def httpx(self, **kw: Any) -> httpx.Client:
        return httpx.Client(verify=self.client_context(), **kw)
