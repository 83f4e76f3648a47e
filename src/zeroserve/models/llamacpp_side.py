"""The llama.cpp engine's side port: its own HTTP server on loopback, locked by a key
only this process knows (docs/architecture.md, "The llama.cpp backend").

``xllamacpp.Server`` has no call for its tokenizer or its chat template, so an exact
prompt-token count (needed only when a prompt might not fit a slot's context) and the
``/tokenize`` and ``/detokenize`` routes ask the engine's own ``/apply-template``,
``/tokenize`` and ``/detokenize``. One short connection per question, on
the project's own HTTP/1.1 client framing (``http/client.py``); loopback, no model work,
so milliseconds; the answer is bounded in bytes and the exchange in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec

from ..errors import DeadlineExceeded, ProtocolError, RequestError, ZeroserveError
from ..http.client import ResponseReader, request_head

# Largest side-port answer read (a token list of a whole context: ~8 bytes a token).
SIDE_MAX_BYTES = 4 << 20
# Bytes read per receive.
_READ_BYTES = 64 * 1024
# At most this much of an engine's refusal is repeated to the client (its messages are
# one short sentence; the bound keeps an echo of client input short too).
MAX_ENGINE_MESSAGE_CHARS = 200


class _EngineError(msgspec.Struct):
    message: str = ""


class _EngineRefusal(msgspec.Struct):
    error: _EngineError | str = ""


class _Rendered(msgspec.Struct):
    prompt: str = ""


class _Tokens(msgspec.Struct):
    tokens: list[Any] = []


class _Text(msgspec.Struct):
    content: str = ""


class SidePort:
    """Questions to one engine's locked side port (``address``: ``http://host:port``)."""

    def __init__(self, address: str, key: str) -> None:
        host, _, port = address.removeprefix("http://").rpartition(":")
        self.host = host
        self.port = int(port) if port else 0
        self._auth = [(b"authorization", b"Bearer " + key.encode("ascii"))]

    async def prompt_tokens(self, chat: bytes | None, prompt: str | None, timeout: float) -> int:
        """Tokens of ``prompt``, or of the chat request ``chat`` rendered by the chat
        template."""
        return len(await self.tokenize(chat, prompt, True, timeout))

    async def tokenize(
        self, chat: bytes | None, prompt: str | None, add_special: bool, timeout: float
    ) -> list[int]:
        """The token ids of ``prompt``, or of ``chat`` rendered by the chat template
        (``add_special``: with the beginning-of-sequence the model's tokenizer adds).

        ``chat`` is the engine's own chat request, the very bytes a chat would run: the
        engine's ``/apply-template`` parses it as its chat route does, so its tools, tool
        choice and format reach the template (a template without native tools gets the
        engine's generic tool prompt) and the count is the engine's ``prompt_tokens``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        if prompt is None:
            assert chat is not None, "a prompt or a chat request"
            rendered = await self._post("/apply-template", chat, end - loop.time())
            prompt = msgspec.json.decode(rendered, type=_Rendered).prompt
        body = msgspec.json.encode({"content": prompt, "add_special": add_special})
        answer = await self._post("/tokenize", body, end - loop.time())
        return [int(t) for t in msgspec.json.decode(answer, type=_Tokens).tokens]

    async def detokenize(self, tokens: Sequence[int], timeout: float) -> str:
        """The text of ``tokens`` (ids the caller checked against the vocabulary: the
        engine fails on others)."""
        body = msgspec.json.encode({"tokens": tokens})
        answer = await self._post("/detokenize", body, timeout)
        return msgspec.json.decode(answer, type=_Text).content

    async def _post(self, path: str, body: bytes, timeout: float) -> bytes:
        head = request_head(
            "POST",
            path,
            f"{self.host}:{self.port}",
            len(body),
            [(b"content-type", b"application/json"), (b"connection", b"close")],
            self._auth,
        )
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                status, payload = await self._exchange(head, body)
        except TimeoutError:
            raise DeadlineExceeded("counting the prompt's tokens took too long") from None
        except (OSError, ProtocolError, msgspec.DecodeError) as exc:
            raise ZeroserveError(f"the engine could not count the prompt's tokens: {exc}") from None
        if status == 200:
            return payload
        if 400 <= status < 500:  # the engine refused the conversation: the client's fault
            raise RequestError(  # (e.g. two assistant messages at the end), not ours
                f"the model's chat template refused the request: {_message(payload)}",
                param="messages" if path == "/apply-template" else "prompt",
            )
        raise ZeroserveError("the engine could not count the prompt's tokens")

    async def _exchange(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.writelines([head, body])
            parser = ResponseReader()
            parser.start("POST")
            parts: list[bytes] = []
            size = 0
            while not parser.done:
                data = await reader.read(_READ_BYTES)
                if not data:
                    if not parser.feed_eof():
                        raise ProtocolError("the engine closed the connection mid-answer")
                    break
                for view in parser.feed(data):
                    size += len(view)
                    if size > SIDE_MAX_BYTES:
                        raise ProtocolError(f"the engine's answer is over {SIDE_MAX_BYTES} bytes")
                    parts.append(bytes(view))
            assert parser.head is not None
            return parser.head.status, b"".join(parts)
        finally:
            writer.close()


def _message(payload: bytes) -> str:
    """The message of llama.cpp's ``{"error": {"message": ...}}`` answer, bounded."""
    try:
        err = msgspec.json.decode(payload, type=_EngineRefusal).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "no reason given"
    text = err if isinstance(err, str) else err.message
    if len(text) > MAX_ENGINE_MESSAGE_CHARS:
        text = text[: MAX_ENGINE_MESSAGE_CHARS - 1] + "…"
    return text or "no reason given"
