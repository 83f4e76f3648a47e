"""Who may control models (app/control/access.py): the peer address the server sees, the
``admin`` flag of the keys file, and the ``--keep-alive`` durations the command reads."""

from __future__ import annotations

import argparse

import pytest

from zeroserve.app.control.access import require_admin
from zeroserve.app.request import Request
from zeroserve.app.router import Router
from zeroserve.cli import _duration
from zeroserve.edge import ApiKey, EdgeContext
from zeroserve.edge.keys import keys_from_mapping
from zeroserve.errors import Forbidden
from zeroserve.http.request import RequestHead
from zeroserve.server.connection import is_loopback


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        (("127.0.0.1", 5000), True),
        (("127.8.9.10", 5000), True),
        (("::1", 5000, 0, 0), True),
        (("::ffff:127.0.0.1", 5000, 0, 0), True),
        (("fe80::1%eth0", 5000, 0, 2), False),
        (("10.0.0.7", 5000), False),
        (("::ffff:10.0.0.7", 5000, 0, 0), False),
        (("not an address", 1), False),
        ("", True),  # a Unix socket's peer
        (None, False),
    ],
)
def test_loopback_peers(peer: object, local: bool) -> None:
    assert is_loopback(peer) is local


def _request(loopback: bool, key: ApiKey | None = None) -> Request:
    """A request for the load route, as the server builds one (the compiled ``Request``
    takes only real heads and routes)."""
    router = Router()
    router.add("POST", "/models/load", lambda req: None)
    route, params = router.match("POST", "/models/load")
    head = RequestHead(
        method="POST",
        target=b"/models/load",
        path="/models/load",
        query="",
        version="1.1",
        headers=[],
        content_length=0,
        chunked=False,
        keep_alive=True,
        expect_continue=False,
        head_bytes=0,
    )
    req = Request(head, params, route)
    req.loopback = loopback
    req.edge = EdgeContext(b"", [], lambda: 0.0)
    req.edge.key = key
    return req


def test_without_keys_only_a_local_peer_is_admin() -> None:
    require_admin(_request(True), keyed=False)
    with pytest.raises(Forbidden, match="only from this host") as info:
        require_admin(_request(False), keyed=False)
    assert info.value.status == 403


def test_with_keys_only_an_admin_key_is_admin_wherever_it_comes_from() -> None:
    admin, user = keys_from_mapping(
        {"keys": {"ops": {"key": "sk-ops", "admin": True}, "app": {"key": "sk-app"}}}
    )
    assert admin.admin and not user.admin and "admin=True" in repr(admin)
    require_admin(_request(False, admin), keyed=True)
    for req in (_request(True, user), _request(True)):  # loopback does not matter then
        with pytest.raises(Forbidden, match="admin API key"):
            require_admin(req, keyed=True)


def test_the_admin_flag_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match=r"\[keys.ops\]: 'admin' must be true or false"):
        keys_from_mapping({"keys": {"ops": {"key": "sk-ops", "admin": "yes"}}})


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0.0), ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0)]
)
def test_keep_alive_durations(text: str, seconds: float) -> None:
    assert _duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "5x", "-1m", "inf"])
def test_bad_keep_alive_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _duration(text)
