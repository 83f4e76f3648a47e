"""The baseline peer: FastAPI + uvicorn[standard] (uvloop, httptools), buffered.

This is the code a user would otherwise write: ``await request.body()`` to get the body,
``Response`` to send it back, ``StreamingResponse`` over an async generator for SSE, and
pydantic models for OpenAI chunks. Run: ``python -m zeroserve.bench.peers.fastapi_app --port P``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

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
            id=cid, created=created, model=req.model,
            choices=[CompletionChoice(text=text, finish_reason=finish)],
            usage=Usage(prompt_tokens=len(prompt.split()), completion_tokens=n,
                        total_tokens=len(prompt.split()) + n),
        )

    async def chunks() -> AsyncIterator[str]:
        pieces = list(echo_tokens(prompt, req.max_tokens))
        for i, piece in enumerate(pieces):
            chunk = Completion(
                id=cid, created=created, model=req.model,
                choices=[CompletionChoice(
                    text=piece, finish_reason=finish if i == len(pieces) - 1 else None)],
            )
            yield f"data: {chunk.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
