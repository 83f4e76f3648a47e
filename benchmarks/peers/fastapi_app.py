"""The baseline peer: FastAPI + uvicorn[standard] (uvloop, httptools), buffered.

This is the code a user would otherwise write: ``await request.body()`` to get the body,
``Response`` to send it back, ``StreamingResponse`` over an async generator for SSE, and
pydantic models for OpenAI chunks. Run: ``python -m benchmarks.peers.fastapi_app --port P``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from ._echo import echo_tokens

MODELS = ("echo",)

app = FastAPI()


def _not_found(model: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"model {model!r} not found"}}, status_code=404)


@app.get("/health")
async def health() -> Response:
    return Response(b"ok", media_type="text/plain")


@app.post("/v1/raw/{model}")
async def raw(model: str, request: Request) -> Response:
    if model not in MODELS:
        return _not_found(model)
    body = await request.body()
    if "text/event-stream" in request.headers.get("accept", ""):

        async def events() -> AsyncIterator[bytes]:
            for token in body.split():
                yield b"data: " + token + b"\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
    return Response(body, media_type="application/octet-stream")


class CompletionRequest(BaseModel):
    model: str
    prompt: str | list[str]
    max_tokens: int | None = None
    stream: bool = False
    temperature: float | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


@app.post("/v1/completions", response_model=None)
async def completions(req: CompletionRequest) -> Response | Completion:
    if req.model not in MODELS:
        return _not_found(req.model)
    prompt = req.prompt if isinstance(req.prompt, str) else " ".join(req.prompt)
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    finish: Literal["stop", "length"] = (
        "length" if req.max_tokens is not None and req.max_tokens <= len(prompt.split()) else "stop"
    )
    if not req.stream:
        text = "".join(echo_tokens(prompt, req.max_tokens))
        n = len(text.split())
        return Completion(
            id=cid,
            created=created,
            model=req.model,
            choices=[CompletionChoice(text=text, finish_reason=finish)],
            usage=Usage(
                prompt_tokens=len(prompt.split()),
                completion_tokens=n,
                total_tokens=len(prompt.split()) + n,
            ),
        )

    async def chunks() -> AsyncIterator[str]:
        pieces = list(echo_tokens(prompt, req.max_tokens))
        for i, piece in enumerate(pieces):
            chunk = Completion(
                id=cid,
                created=created,
                model=req.model,
                choices=[
                    CompletionChoice(
                        text=piece, finish_reason=finish if i == len(pieces) - 1 else None
                    )
                ],
            )
            yield f"data: {chunk.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


# -- OpenAI chat completions (W3, the default-model streams) ----------------------------
# ``echo`` answers with the tokens of the rendered chat prompt (the default template of
# zeroserve's models), like zeroserve's echo model; ``tinyllm`` (loaded only with
# ``--tinyllm``) runs zeroserve's embedded demo model, sync generator in the thread pool.


class ChatMessage(BaseModel):
    role: str
    content: str | None = None


class ChatRequest(BaseModel):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]


_TINYLLM: dict[str, Any] = {}


def _chat_prompt(messages: list[ChatMessage]) -> str:
    """The default chat template of zeroserve's models (``Model.chat_template``)."""
    return "".join(f"<|{m.role}|>\n{m.content or ''}\n" for m in messages) + "<|assistant|>\n"


def _chat_pieces(req: ChatRequest) -> tuple[Iterator[str], list[str], int]:
    """(pieces, [finish reason, set when the pieces are exhausted], prompt tokens)."""
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if req.model == "tinyllm":
        from zeroserve import GenerateRequest

        model = _TINYLLM["model"]
        prompt = model.chat_template([m.model_dump() for m in req.messages])
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        gen = model.generate(
            GenerateRequest(
                prompt=prompt,
                max_tokens=limit,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                seed=req.seed,
                stop=stop,
            )
        )
        finish = ["stop"]

        def run() -> Iterator[str]:
            finish[0] = yield from gen

        return run(), finish, int(model.count_tokens(prompt))
    prompt = _chat_prompt(req.messages)
    n = len(prompt.split())
    return (
        echo_tokens(prompt, limit),
        ["length" if limit is not None and limit <= n else "stop"],
        n,
    )


@app.post("/v1/chat/completions", response_model=None)
async def chat_completions(req: ChatRequest) -> Response | ChatCompletion:
    if req.model not in MODELS and not (req.model == "tinyllm" and _TINYLLM):
        return _not_found(req.model)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    pieces, finish, prompt_tokens = _chat_pieces(req)
    if not req.stream:
        text = "".join(pieces)  # tinyllm runs on the event loop here (W3 uses echo only)
        n = len(text.split())
        return ChatCompletion(
            id=cid,
            created=created,
            model=req.model,
            choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=finish[0])],  # type: ignore[arg-type]
            usage=Usage(
                prompt_tokens=prompt_tokens, completion_tokens=n, total_tokens=prompt_tokens + n
            ),
        )

    def chunk(delta: ChatDelta, reason: Any = None) -> str:
        c = ChatChunk(
            id=cid,
            created=created,
            model=req.model,
            choices=[ChatChunkChoice(delta=delta, finish_reason=reason)],
        )
        return f"data: {c.model_dump_json()}\n\n"

    def events() -> Iterator[str]:
        # A sync iterator: StreamingResponse pulls it in the thread pool, so tinyllm's
        # decode steps run off the event loop (zeroserve itself now runs tinyllm in a worker process).
        yield chunk(ChatDelta(role="assistant", content=""))
        for piece in pieces:
            yield chunk(ChatDelta(content=piece))
        yield chunk(ChatDelta(), finish[0])
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


# -- KServe V2 JSON inference (W4) -------------------------------------------------------
# The JSON half of the V2 protocol as a FastAPI app would write it: pydantic models for
# the request and the response, the identity model returning every input as an output.


class V2Tensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] = Field(default_factory=list)


class V2Output(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class V2Request(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[V2Tensor]
    outputs: list[V2Output] | None = None


class V2Response(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[V2Tensor]


@app.post("/v2/models/{model}/infer", response_model=None)
async def v2_infer(model: str, req: V2Request) -> Response | V2Response:
    if model not in MODELS:
        return JSONResponse({"error": f"model {model!r} not found"}, status_code=404)
    return V2Response(
        model_name=model,
        model_version="1",
        id=req.id,
        outputs=[
            V2Tensor(name=t.name, datatype=t.datatype, shape=t.shape, data=t.data)
            for t in req.inputs
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--tinyllm",
        action="store_true",
        help="also serve zeroserve's embedded tinyllm model on chat completions",
    )
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (uvicorn)")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key")
    args = parser.parse_args(argv)
    if args.tinyllm:
        from zeroserve.models.tinyllm import TinyLlamaModel

        model = TinyLlamaModel()
        model.load()
        _TINYLLM["model"] = model
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
