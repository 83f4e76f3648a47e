"""The gateway reaches ``https://`` upstreams and verifies their certificates by default."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.edge.servers import Certs
from tests.support import ServerThread
from zeroserve.edge import Edge
from zeroserve.models.echo import EchoModel
from zeroserve.models.loader import parse_spec
from zeroserve.runtime import ModelConfig
from zeroserve.server.options import ServerOptions, TlsOptions


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("gw-tls"))


@pytest.fixture(scope="module")
def upstream(certs: Certs) -> Iterator[ServerThread]:
    options = ServerOptions(port=0, tls=TlsOptions(str(certs.cert), str(certs.key)))
    server = ServerThread(
        {"echo": ModelConfig("echo", EchoModel)}, edge=Edge(), options=options
    ).start()
    yield server
    server.stop()


def gateway(upstream: ServerThread) -> ServerThread:
    spec = parse_spec(f"g=remote:{upstream.url}/v1?upstream_model=echo&retries=0")
    configs = {"g": ModelConfig("g", spec.load_class(), options=spec.options, **spec.runtime)}
    return ServerThread(configs, edge=Edge()).start()


def test_an_untrusted_upstream_certificate_is_refused(upstream: ServerThread) -> None:
    gw = gateway(upstream)
    try:
        r = httpx.post(gw.url + "/v1/raw/g", content=b"hello")
        assert r.status_code in (502, 503), r.text
        assert r.json()["error"]["code"].startswith("upstream")
    finally:
        gw.stop()


def test_a_trusted_upstream_is_relayed_over_tls(
    upstream: ServerThread, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default context trusts what OpenSSL's default paths name; point them at our CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(certs.cert))
    gw = gateway(upstream)
    try:
        r = httpx.post(gw.url + "/v1/raw/g", content=b"hello over tls")
        assert r.status_code == 200 and r.content == b"hello over tls"
    finally:
        gw.stop()
