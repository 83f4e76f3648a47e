"""The relay's sans-I/O parts, driven by bytes: the ``"model"`` rewriter, and the remote
model's options. (The response reader is the client role of ``http/``: tests/http.)"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroserve.app.relay._rewrite import model_spans, rewrite_model

# -- the "model" rewriter -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"a","x":1}', {"model": "B", "x": 1}),
        (
            b' { "x" : [1, {"model": "no"}, "]"] , "model" : "a" } ',
            {"x": [1, {"model": "no"}, "]"], "model": "B"},
        ),
        (
            b'{"messages":[{"content":"\\"model\\": \\"x\\""}],"model":"a"}',
            {"messages": [{"content": '"model": "x"'}], "model": "B"},
        ),
        (b'{"mod\\u0065l":"a"}', {"model": "B"}),
        (b'{"model":"a","model":"c"}', {"model": "B"}),
    ],
)
def test_rewrite_model_only(body: bytes, expected: dict[str, object]) -> None:
    out = rewrite_model(memoryview(body), "B")
    assert out is not None
    assert msgspec.json.decode(b"".join(bytes(b) for b in out)) == expected


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"x":1}', b'{"model":1}', b'{"model":"a"', b"{bad}", b'{"a":tru'],
)
def test_no_rewrite_when_there_is_nothing_to_rewrite(body: bytes) -> None:
    assert rewrite_model(memoryview(body), "B") is None


def test_rewrite_keeps_the_rest_as_views_of_the_body() -> None:
    prompt = "word " * 20000
    body = msgspec.json.encode({"model": "a", "messages": [{"role": "user", "content": prompt}]})
    out = rewrite_model(memoryview(body), "upstream-name")
    assert out is not None and len(out) == 3
    assert isinstance(out[2], memoryview) and out[2].obj is body
    assert msgspec.json.decode(b"".join(bytes(b) for b in out))["model"] == "upstream-name"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.text(), st.booleans())
def test_rewrite_property(obj: dict[str, object], name: str, with_model: bool) -> None:
    if with_model:
        obj = {**obj, "model": "original"}
    body = msgspec.json.encode(obj)
    spans = model_spans(body)
    assert spans is not None
    out = rewrite_model(memoryview(body), name)
    if isinstance(obj.get("model"), str):
        assert out is not None
        assert msgspec.json.decode(b"".join(bytes(b) for b in out)) == {**obj, "model": name}
    else:
        assert out is None


# -- the remote model's options -------------------------------------------------------------


def test_remote_spec_options_are_checked_at_load() -> None:
    from zeroserve.models.loader import parse_spec
    from zeroserve.models.remote import RemoteModel

    spec = parse_spec(
        "g=remote:http://a:1/v1/,https://b/v1?upstream_model=m&connections=4&timeout=2.5"
    )
    m = RemoteModel(**spec.options)
    assert [u.url for u in m.config.upstreams] == ["http://a:1/v1", "https://b/v1"]
    assert [(u.port, u.base_path, u.authority) for u in m.config.upstreams] == [
        (1, "/v1", "a:1"),
        (443, "/v1", "b"),
    ]
    assert (m.config.upstream_model, m.config.connections, m.config.timeout) == ("m", 4, 2.5)
    assert RemoteModel.capabilities() == frozenset()  # the engine hosts it with none
    for bad in ("", "ftp://x/v1", "http:///v1", "http://h/v1?x=1"):
        with pytest.raises(ValueError):
            RemoteModel(location=bad)
    for opts in ({"connections": 0}, {"timeout": "soon"}, {"colour": "blue"}):
        with pytest.raises(ValueError):
            RemoteModel(location="http://h/v1", **opts)
    with pytest.raises(ValueError, match="ZS_UNSET_KEY"):
        RemoteModel(location="http://h/v1", api_key_env="ZS_UNSET_KEY").load()
