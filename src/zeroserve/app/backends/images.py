"""A chat's images before its backend answers (docs/architecture.md, "Images in chat"):
the model must read images (its ``input_modalities``), and the images given by URL are
fetched, under the operator's policy, before a ticket is taken.

Remote URLs are refused unless the server was given hosts to fetch from
(``--allow-image-urls``); each fetch goes through the guard of
``upstream/image_fetch.py``. A refused or failed fetch is a 400 naming the part: the URL
is the client's input.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ...errors import RequestError
from ...upstream.image_fetch import (
    FETCH_TIMEOUT_S,
    ImageFetchError,
    ImageFetchPolicy,
    fetch_image,
)
from ..chat import ChatRequest
from ..chat.images import ImagePart
from ..response import HandlerResult, Response, StreamResponse
from .base import Backend

__all__ = ["FETCH_TIMEOUT_S", "ImageFetchPolicy", "with_images"]


def with_images(
    backend: Backend,
    chat: ChatRequest,
    policy: ImageFetchPolicy | None,
    answer: Callable[[], HandlerResult],
) -> HandlerResult:
    """``answer()`` once ``chat``'s images are readable by ``backend``'s model: a 400
    naming the first image it cannot take, or the first URL that is not fetched."""
    if "image" not in backend.capabilities().input_modalities:
        chat.refuse_images()
    remote = [p for p in chat.images if p.remote]
    if not remote:
        return answer()
    if policy is None:
        raise RequestError(
            "this server does not fetch image URLs; send the image inline as a data: URI "
            "(an operator may allow hosts with --allow-image-urls)",
            param=remote[0].param,
            code="image_url_not_allowed",
        )
    return _fetched(remote, policy, answer)


async def _fetched(
    parts: list[ImagePart], policy: ImageFetchPolicy, answer: Callable[[], HandlerResult]
) -> Response | StreamResponse:
    for part in parts:  # one at a time: each fetch is bounded, and few images have URLs
        assert part.url is not None
        try:
            data = await fetch_image(part.url, policy)
        except ImageFetchError as exc:
            raise RequestError(str(exc), param=part.param, code="image_url_refused") from None
        part.fetched(data)
    result = answer()
    return await result if inspect.isawaitable(result) else result
