"""Limits on what one API request may ask for, each a named constant with its reason.

Two kinds, kept apart on purpose (see ``docs/architecture.md``, "Hostile input"):

* **Ranges** protect the code: a number outside them cannot be represented further
  down (a C ``long``, a numpy ``int64``, a shape product). They are fixed, and the
  schemas enforce them at decode time with ``msgspec.Meta`` (``RANGE_*`` below).
* **Counts** are policy: how many inputs, messages, choices or tensors one request may
  carry. They are configurable (:class:`ApiLimits`, the ``[api_limits]`` config table)
  and checked right after decoding, so the answer is a 400 naming the parameter and the
  limit, before a ticket's work begins.

Decoding itself is bounded too: msgspec decodes nested arrays and objects recursively
and raises ``RecursionError`` past the interpreter's recursion limit; :func:`decoding`
turns that (and anything else msgspec raises) into our 400.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import msgspec

from ..errors import RequestError

# -- ranges (fixed) ---------------------------------------------------------------------
# Largest ``max_tokens`` (and ``max_completion_tokens``, raw ``?max_tokens=``) any code
# below may be handed: the longest context windows served today are about 10 M tokens;
# 2^24 is above any of them and far inside a C int, so no model's arithmetic on it
# overflows. This is representability, not policy: how many tokens a request may ask
# for is ``ApiLimits.output_tokens`` (MAX_OUTPUT_TOKENS below), which is configurable up
# to this bound and no further.
MAX_TOKENS = 1 << 24
# ``seed`` is a signed 64-bit integer, as OpenAI documents it (numpy's generators and C
# samplers take 64 bits; a bigger Python int raises ``OverflowError`` in them).
SEED_MIN = -(1 << 63)
SEED_MAX = (1 << 63) - 1
# Per-choice seeds are ``seed + j`` folded into this unsigned range (numpy refuses
# negative seeds; 64 bits is what every sampler takes).
SEED_SPACE = 1 << 64
# ``dimensions`` of an embedding. OpenAI's largest model has 3,072; 2^16 leaves room for
# any served model and keeps ``inputs * dimensions`` floats within a response.
MAX_DIMENSIONS = 1 << 16
# ``logprobs`` (completions) and ``top_logprobs`` (chat): OpenAI allows 0..5 and 0..20.
MAX_COMPLETION_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20
# ``best_of`` (completions): OpenAI's own bound.
MAX_BEST_OF = 20
# V2 tensors: numpy 1.x arrays have at most 32 dimensions (numpy 2 raised it to 64, ONNX
# and Triton models rarely use more than 8), so a deeper shape could not be built anyway.
MAX_TENSOR_RANK = 32
# One V2 dimension: a signed 64-bit integer, as the protocol's (and Triton's) shapes are.
MAX_TENSOR_DIM = (1 << 63) - 1
# Elements of one tensor, counting only its nonzero dimensions (an empty tensor must still
# have a shape numpy can build): times the widest element (8 bytes) this must fit numpy's
# signed 64-bit size. Real tensors are bounded far earlier, by the body they arrive in.
MAX_TENSOR_ELEMENTS = 1 << 59
# Raw ``?timeout=`` / ``request-timeout`` and ``x-stainless-timeout``: a day in seconds.
# Longer is not a deadline; the server's own limit caps the value anyway.
MAX_TIMEOUT_S = 86_400.0

# -- counts (configurable, see ApiLimits) -----------------------------------------------
# Embedding inputs per request: OpenAI's limit ("must be ... 2048 dimensions or less").
MAX_EMBEDDING_INPUTS = 2048
# Chat messages per request. Every message is templated into one prompt; 2,048 turns is
# far beyond any real conversation and bounds the templating work a request can demand.
MAX_MESSAGES = 2048
# Prompts per completions request (a list ``prompt``), as embeddings inputs.
MAX_PROMPTS = 2048
# Stop sequences: OpenAI accepts at most four.
MAX_STOP = 4
# Tools declared by a chat request: OpenAI's limit.
MAX_TOOLS = 128
# Choices (``n``): OpenAI's limit.
MAX_N = 128
# Generations one request starts (prompts x n): each holds a ticket and a stream, so
# this bounds one request's share of a model's queue; equal to MAX_N.
MAX_GENERATIONS = 128
# Tokens one request may ask to generate in all (generations x max_tokens), on every
# route that generates (OpenAI chat and completions, a llama.cpp engine's, raw streams):
# 2^22 tokens is about 16 MiB of text, the size of our largest whole (non-streamed)
# response. Policy, so configurable, but never above MAX_TOKENS (the range).
MAX_OUTPUT_TOKENS = 1 << 22
# V2 input and output tensors per request. Models declare a handful; 1,024 is beyond any
# real model and bounds the per-tensor work (validation, descriptors) of one request.
MAX_V2_INPUTS = 1024
MAX_V2_OUTPUTS = 1024
# Bytes of V2 outputs one response may carry: the request body limit (128 MiB), so an
# answer is never larger than the biggest question we accept.
MAX_V2_OUTPUT_BYTES = 128 * 1024 * 1024
# Images in one chat request (docs/architecture.md, "Images in chat"): each costs a
# projector pass and hundreds of prompt tokens; vLLM's default per-prompt limit is one,
# OpenAI documents 500. 32 covers multi-page documents on a small context.
MAX_IMAGES = 32
# Bytes of one image, decoded: OpenAI's documented per-image limit (20 MB). Checked
# from the base64 text's length before the text is read, and as a fetch's cap.
MAX_IMAGE_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """The count limits the endpoints enforce (defaults: the constants above)."""

    embedding_inputs: int = MAX_EMBEDDING_INPUTS
    messages: int = MAX_MESSAGES
    prompts: int = MAX_PROMPTS
    stop: int = MAX_STOP
    tools: int = MAX_TOOLS
    n: int = MAX_N
    generations: int = MAX_GENERATIONS
    output_tokens: int = MAX_OUTPUT_TOKENS
    v2_inputs: int = MAX_V2_INPUTS
    v2_outputs: int = MAX_V2_OUTPUTS
    v2_output_bytes: int = MAX_V2_OUTPUT_BYTES
    images: int = MAX_IMAGES
    image_bytes: int = MAX_IMAGE_BYTES

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"api limit {name!r} must be a positive integer")
        if self.output_tokens > MAX_TOKENS:
            raise ValueError(f"api limit 'output_tokens' must be at most {MAX_TOKENS}")


def check_count(count: int, limit: int, param: str, what: str) -> None:
    """Raise a 400 naming ``param`` when ``count`` exceeds ``limit``."""
    if count > limit:
        raise RequestError(
            f"too many {what}: at most {limit} are accepted",
            param=param,
            code="limit_exceeded",
        )


def check_output_tokens(
    generations: int, max_tokens: int | None, limits: ApiLimits, param: str = "max_tokens"
) -> None:
    """Raise a 400 naming ``param`` when ``generations`` x ``max_tokens`` exceeds the
    request's output-token budget (``limits.output_tokens``)."""
    if max_tokens is not None:
        check_count(
            generations * max_tokens,
            limits.output_tokens,
            param,
            f"output tokens (generations x {param})",
        )


@contextmanager
def decoding(what: str, *, code: str = "invalid_json") -> Iterator[None]:
    """Around a msgspec decode: nesting past the decoder's recursion bound (and any
    other decoder failure besides validation) is a 400, never a 500.

    ``msgspec.ValidationError`` and ``msgspec.DecodeError`` pass through for the caller's
    own, more specific, messages.
    """
    try:
        yield
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise
    except RecursionError:
        raise RequestError(f"{what} nests arrays or objects too deeply", code=code) from None
    except (ValueError, OverflowError) as exc:
        raise RequestError(f"{what} cannot be decoded ({type(exc).__name__})", code=code) from None
