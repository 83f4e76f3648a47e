"""Images in chat (docs/architecture.md, "Images in chat"), end to end on real servers.

``eye`` is the built-in SmolLM2 with a projector built by the tests
(``tests/support/vision.py``): the engine's whole image path runs (decode, encode,
project, the image's tokens in the prompt). The projector's weights are random, so the
tests assert that an image is accepted, answered and costs prompt tokens, never what
the model "sees". ``smollm2`` (no projector) and ``echo`` read no images: they refuse one
with a 400 naming the part. Clients: the official ``openai`` and ``anthropic`` SDKs and
httpx.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support import ServerProcess, model_scaled, start_server
from tests.support.image_server import serve_images
from tests.support.vision import WEBP_HEAD, gif, png, write_projector

pytest.importorskip("xllamacpp")

# Its smollm2 cases wait on the niced decode: pytest-timeout by model_slowdown
# (tests/conftest.py; docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

# Small limits, so the 413 and the count are reached with small bodies.
IMAGE_BYTES = 64 * 1024
IMAGES = 3
RED = png(64, 48)
BLUE = png(20, 30, (10, 20, 200))
QUESTION = "What is in this picture?"


def uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def image_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}, *parts]}]


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("vision") / "mmproj.gguf")


@pytest.fixture(scope="module")
def vision(projector: Path) -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "echo",
        "--model", "smollm2?n_ctx=1024&parallel=1",
        "--model", f"eye=smollm2?mmproj={projector}&n_ctx=1024&parallel=1",
        env={
            "ZEROSERVE_API_LIMITS__IMAGE_BYTES": str(IMAGE_BYTES),
            "ZEROSERVE_API_LIMITS__IMAGES": str(IMAGES),
        },
    )  # fmt: skip
    yield server
    assert server.stop() == 0


@pytest.fixture
def http(vision: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vision.url, timeout=model_scaled(120)) as c:
        yield c


def chat(http: httpx.Client, model: str, messages: Any, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0, **extra}
    return http.post("/v1/chat/completions", json=body)


def refused(r: httpx.Response, status: int, param: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    return error


def copied(http: httpx.Client, site: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'zeroserve_copied_bytes_total{{site="{site}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- capabilities ----------------------------------------------------------------------------
def test_models_say_which_read_images(vision: ServerProcess) -> None:
    client = vision.client()
    cards = {m.id: m.model_extra["capabilities"] for m in client.models.list()}  # type: ignore[index]
    assert cards["eye"]["input_modalities"] == ["text", "image"]
    assert cards["smollm2"]["input_modalities"] == ["text"]
    assert cards["echo"]["input_modalities"] == ["text"]


@pytest.mark.parametrize("model", ["echo", "smollm2"])
def test_a_model_without_images_refuses_one_by_name(http: httpx.Client, model: str) -> None:
    error = refused(chat(http, model, user(image_part(uri(RED)))), 400, "messages[0].content[1]")
    assert error["code"] == "image_input_not_supported"
    r = http.post(
        "/v1/responses",
        json={
            "model": model,
            "max_output_tokens": 2,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": QUESTION},
                        {"type": "input_image", "image_url": uri(RED), "detail": "auto"},
                    ],
                }
            ],
        },
    )
    refused(r, 400, "input[0].content[1]")


# -- answers ---------------------------------------------------------------------------------
def test_chat_with_an_image_answers_and_counts_its_tokens(vision: ServerProcess) -> None:
    client = vision.client()

    def ask(*parts: dict[str, Any]) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model="eye",
            messages=user(*parts),
            max_tokens=2,
            temperature=0,  # type: ignore[arg-type]
        )

    text = ask()
    red = ask(image_part(uri(RED)))
    blue = ask(image_part(uri(BLUE), detail="auto"))
    two = ask(image_part(uri(RED)), image_part(uri(gif(), "image/gif")))
    assert red.choices[0].message.content
    assert text.usage is not None and red.usage is not None and blue.usage is not None
    assert two.usage is not None
    image_tokens = red.usage.prompt_tokens - text.usage.prompt_tokens
    assert image_tokens > 0
    # The projector gives every image the same number of tokens, whatever it shows.
    assert blue.usage.prompt_tokens == red.usage.prompt_tokens
    assert two.usage.prompt_tokens == text.usage.prompt_tokens + 2 * image_tokens


def test_a_streamed_chat_with_an_image(vision: ServerProcess) -> None:
    client = vision.client()
    stream = client.chat.completions.create(
        model="eye",
        messages=user(image_part(uri(RED))),  # type: ignore[arg-type]
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(c.choices and c.choices[0].delta.content for c in chunks)


def test_responses_input_image(vision: ServerProcess) -> None:
    client = vision.client()

    def ask(*parts: dict[str, Any]) -> Any:
        return client.responses.create(
            model="eye",
            max_output_tokens=2,
            input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}, *parts]}],  # type: ignore[misc,list-item]
        )

    text = ask()
    image = ask({"type": "input_image", "image_url": uri(RED), "detail": "auto"})
    assert image.output_text
    assert image.usage.input_tokens > text.usage.input_tokens


def test_messages_image_block(vision: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=vision.url, api_key="x")
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(RED).decode(),
        },
    }

    def ask(*blocks: dict[str, Any]) -> Any:
        return client.messages.create(
            model="eye",
            max_tokens=2,
            messages=[{"role": "user", "content": [*blocks, {"type": "text", "text": QUESTION}]}],  # type: ignore[typeddict-item]
        )

    text = ask()
    image = ask(block)
    assert image.content[0].text
    assert image.usage.input_tokens > text.usage.input_tokens
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="smollm2",
            max_tokens=2,
            messages=[{"role": "user", "content": [block]}],  # type: ignore[list-item]
        )
    assert "messages[0].content[0]" in info.value.message


def test_the_image_text_is_copied_once_into_the_engine_request(http: httpx.Client) -> None:
    """The base64 text goes from the body's view into the engine's request, no other
    copy counted: not decoded, not unescaped (docs/decisions/0032-images-stay-base64.md)."""
    text = base64.b64encode(RED)
    before = {s: copied(http, s) for s in ("engine_body", "image_unescape", "image_base64")}
    assert chat(http, "eye", user(image_part(uri(RED)))).status_code == 200
    after = {s: copied(http, s) for s in before}
    assert after["engine_body"] - before["engine_body"] >= len(text)
    assert after["image_unescape"] == before["image_unescape"]
    assert after["image_base64"] == before["image_base64"]


def test_an_escaped_data_uri_is_unescaped_once(http: httpx.Client) -> None:
    """JSON may write ``/`` as ``\\/``: such a string is unescaped (one counted copy)."""
    url = uri(RED).replace("/", "\\/")
    body = (
        '{"model": "eye", "max_tokens": 2, "messages": [{"role": "user", "content": '
        '[{"type": "image_url", "image_url": {"url": "' + url + '"}}]}]}'
    )
    before = copied(http, "image_unescape")
    r = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    assert copied(http, "image_unescape") - before >= len(uri(RED))


# -- what is refused, by name ----------------------------------------------------------------
PART = "messages[0].content[1]"


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,not base64!", "invalid_image"),
        ("data:image/png;base64,iVBORw0KGgo", "invalid_image"),  # not a multiple of 4
        ("data:image/png," + base64.b64encode(RED).decode(), "invalid_image"),  # not base64
        ("data:text/plain;base64," + base64.b64encode(RED).decode(), "invalid_image"),
        ("data:image/png;base64," + base64.b64encode(b"just some text").decode(), "invalid_image"),
        ("data:image/png;base64", "invalid_image"),  # no comma
        ("ftp://example.com/cat.png", "invalid_image_url"),
        ("http://example.com/cat.png", "image_url_not_allowed"),  # no --allow-image-urls
    ],
    ids=[
        "alphabet",
        "length",
        "not-base64",
        "media-type",
        "not-an-image",
        "no-comma",
        "ftp",
        "url",
    ],
)
def test_bad_images_are_400s_naming_the_part(http: httpx.Client, url: str, code: str) -> None:
    assert refused(chat(http, "eye", user(image_part(url))), 400, PART)["code"] == code


def test_an_image_over_the_limit_is_413_before_it_is_read(http: httpx.Client) -> None:
    big = b"\x89PNG\r\n\x1a\n" + bytes(IMAGE_BYTES)
    error = refused(chat(http, "eye", user(image_part(uri(big)))), 413, PART)
    assert str(IMAGE_BYTES) in error["message"]
    # Counted from the text's length: even text that is not base64 gets the 413.
    junk = "data:image/png;base64," + "!" * (IMAGE_BYTES * 2)
    refused(chat(http, "eye", user(image_part(junk))), 413, PART)
    r = http.post(
        "/v1/messages",
        json={
            "model": "eye",
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": base64.b64encode(big).decode(),
                            },
                        }
                    ],
                }
            ],
        },
    )
    assert r.status_code == 413, r.text
    assert r.json()["type"] == "error" and "messages[0].content[0]" in r.json()["error"]["message"]


def test_too_many_images(http: httpx.Client) -> None:
    parts = [image_part(uri(RED)) for _ in range(IMAGES + 1)]
    error = refused(chat(http, "eye", user(*parts)), 400, f"messages[0].content[{IMAGES + 1}]")
    assert error["code"] == "limit_exceeded"


def test_what_the_engine_cannot_read_is_refused_by_name(http: httpx.Client) -> None:
    webp = WEBP_HEAD + bytes(20)
    refused(chat(http, "eye", user(image_part(uri(webp, "image/webp")))), 400, PART)
    refused(
        chat(http, "eye", user(image_part(uri(RED), detail="high"))),
        400,
        PART + ".image_url.detail",
    )
    # Images only in a user's turn.
    system = [{"role": "system", "content": [image_part(uri(RED))]}, *user()]
    refused(chat(http, "eye", system), 400, "messages[0].content[0]")
    # An image's tokens are the projector's: a token count of one is refused.
    r = http.post(
        "/v1/messages/count_tokens",
        json={
            "model": "eye",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": base64.b64encode(RED).decode(),
                            },
                        }
                    ],
                }
            ],
        },
    )
    assert r.status_code == 400 and "messages[0].content[0]" in r.text


def test_a_declared_media_type_must_be_the_real_one(http: httpx.Client) -> None:
    r = http.post(
        "/v1/messages",
        json={
            "model": "eye",
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/jpeg",
                                "data": base64.b64encode(RED).decode(),
                            },
                        }
                    ],
                }
            ],
        },
    )
    assert r.status_code == 400, r.text
    assert "messages[0].content[0].source.media_type" in r.json()["error"]["message"]


# -- remote images, through the guard ---------------------------------------------------------
@pytest.fixture(scope="module")
def images() -> Iterator[str]:
    with serve_images() as url:
        yield url


@pytest.fixture(scope="module")
def fetching(projector: Path) -> Iterator[ServerProcess]:
    """``eye`` on a server that fetches images from 127.0.0.1 (loopback allowed: the
    unsafe test flag) and from the metadata address (listed, and refused all the same)."""
    server = start_server(
        "--model", f"eye=smollm2?mmproj={projector}&n_ctx=1024&parallel=1",
        "--allow-image-urls", "127.0.0.1,169.254.169.254",
        "--allow-image-urls-loopback",
    )  # fmt: skip
    yield server
    assert server.stop() == 0


def test_a_remote_image_is_fetched_and_read(fetching: ServerProcess, images: str) -> None:
    client = fetching.client()
    messages: Any = user(image_part(images + "/cat.png"))
    answer = client.chat.completions.create(model="eye", messages=messages, max_tokens=2)
    text = client.chat.completions.create(model="eye", messages=user(), max_tokens=2)  # type: ignore[arg-type]
    assert answer.usage is not None and text.usage is not None
    assert answer.usage.prompt_tokens > text.usage.prompt_tokens
    with httpx.Client(base_url=fetching.url, timeout=model_scaled(60)) as http:
        assert copied(http, "image_base64") > 0  # fetched bytes, encoded once for the engine


@pytest.mark.parametrize(
    ("path", "why"),
    [("/to-metadata", "link-local"), ("/to-private", "not one this server fetches")],
)
def test_a_remote_image_redirected_away_is_refused_by_name(
    fetching: ServerProcess, images: str, path: str, why: str
) -> None:
    with httpx.Client(base_url=fetching.url, timeout=model_scaled(60)) as http:
        error = refused(chat(http, "eye", user(image_part(images + path))), 400, PART)
    assert error["code"] == "image_url_refused" and why in error["message"]
