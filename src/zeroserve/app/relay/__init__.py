"""The remote-inference gateway: relays requests for ``remote:`` models to their
OpenAI-compatible upstreams without decoding the streams (docs/gateway.md).

Endpoints dispatch in two lines. Where the model is in the path (raw)::

    relay = relay_for(handle)          # None unless the model is remote
    if relay is not None:
        return await relay.forward(req, relay.raw_path(), rewrite_model=False)

Where it is in the JSON body (OpenAI), before decoding the body, so that parameters
only the upstream understands pass through untouched::

    relay = relay_for_request(engine, req)   # finds "model" without decoding; admits
    if relay is not None:
        return relay.forward(req, "/chat/completions")   # an awaitable

The engine hosts a remote model like any other (it has no capabilities, so admission,
``names()`` and ``/v1/models`` work unchanged); the relay of each is created on first
use, keyed by the model instance, so every engine has its own.

The sockets to the upstreams are ``upstream/``'s and their bytes ``http.client``'s; this
package decides where a request goes and what it carries (docs/gateway.md, "Layering").
"""

from __future__ import annotations

import weakref

import msgspec

from ... import metrics
from ...errors import ModelNotFound, UpstreamUnavailable, UpstreamUnreachable
from ...models.remote import RemoteModel
from ...runtime import Engine, ModelHandle
from ...upstream import UpstreamStatistics
from ..request import Request
from ._relay import Relay, RelayStatistics, api_key
from ._rewrite import model_spans

__all__ = [
    "Relay",
    "RelayStatistics",
    "UpstreamStatistics",
    "UpstreamUnavailable",
    "UpstreamUnreachable",
    "aclose_relays",
    "relay_for",
    "relay_for_request",
    "relays",
]

_RELAYS: weakref.WeakKeyDictionary[RemoteModel, Relay] = weakref.WeakKeyDictionary()


def relay_for(handle: ModelHandle) -> Relay | None:
    """The relay of a model handle (``engine.model(name)``), or None for a local model."""
    meta = handle.model
    if not isinstance(meta, RemoteModel):
        return None
    relay = _RELAYS.get(meta)
    if relay is None:
        key = meta.api_key if meta.api_key is not None else api_key(meta.config)
        relay = _RELAYS[meta] = Relay(handle.name, meta.config, api_key=key)
    return relay


_REMOTE_SERVED: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


def _serves_remote(engine: Engine) -> bool:
    """Whether ``engine`` serves any remote model (computed once per engine)."""
    known = _REMOTE_SERVED.get(engine)
    if known is None:
        known = any(isinstance(engine.model(n).model, RemoteModel) for n in engine.names())
        _REMOTE_SERVED[engine] = known
    return known


def relay_for_request(engine: Engine, req: Request) -> Relay | None:
    """The relay for a JSON request whose ``"model"`` names a remote model, with the
    request admitted (``Overloaded`` 429 raised here); None otherwise (a local model, an
    unknown one, or a body that is not a JSON object: the caller's own decoding reports
    those). Only the ``"model"`` string is decoded, not the body."""
    if not _serves_remote(engine):
        return None  # the common case: no need to scan the body at all
    spans = model_spans(req.body)
    if not spans:
        return None
    start, end = spans[-1]
    try:
        name = msgspec.json.decode(req.body[start:end])
        handle = engine.model(name)
    except (msgspec.DecodeError, ModelNotFound, TypeError):
        return None
    relay = relay_for(handle)
    if relay is not None:
        req.admit(handle)
    return relay


def relays(engine: Engine) -> dict[str, Relay]:
    """The relays of every remote model an engine serves (created now if need be)."""
    out: dict[str, Relay] = {}
    for name in engine.names():
        relay = relay_for(engine.model(name))
        if relay is not None:
            out[name] = relay
    return out


async def aclose_relays(engine: Engine) -> None:
    """Close the upstream connections of an engine's remote models."""
    for name, relay in relays(engine).items():
        await relay.aclose()
        handle = engine.model(name)
        meta = handle.model
        if isinstance(meta, RemoteModel):
            _RELAYS.pop(meta, None)


def _snapshot() -> dict[str, UpstreamStatistics]:
    return {
        f"{relay.name} {url}": stats
        for relay in list(_RELAYS.values())
        for url, stats in relay.statistics().upstreams.items()
    }


# zeroserve_upstream_<field>{name="<model> <url>"} (cumulative fields as *_total
# counters); histograms in _relay.
metrics.register_source(
    "upstream",
    _snapshot,
    counters=(
        "requests",
        "errors",
        "ejections",
        "connects",
        "reused",
        "read_pauses",
        "batches",
        "coalesced",
    ),
)
