"""The Model API that users implement (docs/models.md; docs/architecture.md, "Contracts between the parts").

A model implements only the capabilities it has; the server detects them by which
methods a subclass overrides (``Model.capabilities()``). Every method may be sync or
async: ``generate`` may return an iterator or an async iterator.

Payload conventions (so the runtime can keep bytes in shared memory):

* ``infer`` takes a *batch*: a list with one ``Inputs`` mapping per request, and returns
  one ``Outputs`` mapping per request, in order. Values are ``numpy.ndarray`` (numeric
  tensors, usually zero-copy views of the request body) or, for V2 ``BYTES`` tensors,
  1-D ``numpy`` object arrays of ``bytes``. The raw endpoint passes one input named
  ``"raw"``: a ``uint8`` view of the body, and expects ``"raw"`` back (any buffer).
  When ``max_batch_size`` is 1 the batch always has one element.
* ``generate`` takes a ``GenerateRequest`` and yields text pieces (``str``). A model may
  also yield ``bytes``/``memoryview`` pieces when ``req.raw`` was given (raw streaming).
  A sync generator may ``return "stop"`` or ``return "length"``: the runtime passes that
  value on as ``Stream.finish_reason`` (the OpenAI ``finish_reason``).
* ``embed`` takes a list of strings and returns a float32 array of shape ``(n, dim)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec
import numpy as np

ExecutorKind = Literal["inline", "thread", "process", "ray", "ray-serve"]
Inputs = Mapping[str, Any]
Outputs = Mapping[str, Any]
Piece = str | bytes | memoryview

CAPABILITIES = ("infer", "generate", "embed")


class GenerateRequest(msgspec.Struct, kw_only=True):
    """What ``Model.generate`` receives. Sampling fields follow the OpenAI API."""

    prompt: str = ""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    # vLLM's sampling extensions, at their neutral values unless the model declares it
    # honours them (``Model.honours``; the server refuses them otherwise): sample among
    # the ``top_k`` likeliest tokens (None: all); drop tokens less likely than ``min_p``
    # times the likeliest; divide the positive logits (multiply the negative ones) of
    # tokens already in the prompt or answer by ``repetition_penalty``; never end on an
    # end-of-sequence token (``ignore_eos``: the answer runs to ``max_tokens``), or not
    # before ``min_tokens`` tokens.
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    # Raw streaming: the request body itself (a view of its lease). Models that can
    # stream bytes may yield views of it; others read ``prompt``.
    raw: Any = None


#: The sampling extensions ``GenerateRequest`` carries (vLLM's names), which a model may
#: declare it honours (``Model.honours``).
GENERATE_EXTENSIONS: frozenset[str] = frozenset(
    ("top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens")
)


class TensorSpec(msgspec.Struct, frozen=True):
    """Metadata of one input or output (KServe V2 names; ``-1`` = variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


class ChildHealth(msgspec.Struct, frozen=True):
    """The child processes an in-process model runs itself (``Model.child_health``):
    how many died unasked and how many were started again since the load (exported with
    the workers' ``crashes`` and ``restarts``), and why the model cannot serve now (None:
    it can; the model is then not ready, docs/models.md, "Models at run time")."""

    deaths: int = 0
    restarts: int = 0
    down: str | None = None


NO_CHILDREN = ChildHealth()


class Model:
    """Base class for every model served by zeroserve.

    Class attributes are defaults; config can override them per model.
    """

    executor: ClassVar[ExecutorKind] = "inline"
    # True when load() starts threads that then do the model's work (an engine's own):
    # the runtime calls load() on a thread of its own, at the model's lowered priority,
    # which those threads inherit
    # (docs/decisions/0001-model-nice-levels.md).
    runs_own_threads: ClassVar[bool] = False
    max_batch_size: ClassVar[int] = 1
    max_batch_delay_ms: ClassVar[float] = 5.0
    workers: ClassVar[int] = 1
    # Human-readable description shown by /v1/models and `zeroserve models`.
    description: ClassVar[str] = ""
    # Tokens per chat/completion context, for validation of max_tokens (None = unbounded).
    context_length: ClassVar[int | None] = None
    # The width of ``embed``'s rows, when it is fixed: a request's ``dimensions`` other
    # than it is refused before the model runs, and /v1/models tells it.
    embedding_dimensions: ClassVar[int | None] = None
    # KServe V2 model metadata: the platform and the one version the model is served as.
    platform: ClassVar[str] = "zeroserve"
    version: ClassVar[str] = "1"
    # Which backend serves the model's chat, completion and embedding APIs
    # (docs/architecture.md, "Adding a backend"): "local" (this class's ``generate`` and
    # ``embed``), "llamacpp" (an in-process llama.cpp engine) or "remote" (an upstream).
    served_by: ClassVar[str] = "local"
    # Which of ``GenerateRequest``'s sampling extensions ``generate`` honours (names of
    # ``GENERATE_EXTENSIONS``): the others are refused with a 400 naming them, and
    # /v1/models lists these as the model's ``parameters``.
    honours: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **options: Any) -> None:
        self.options = options

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Load weights. Called once per worker (or once in-process) before serving."""

    def close(self) -> None:
        """Release what ``load`` started outside this process (an in-process model's
        child processes); called once when it stops serving. Blocking is fine: it runs
        on a thread."""

    def processes(self) -> list[int]:
        """The child processes an in-process model runs itself (their memory is the
        model's: docs/models.md, "Memory"), once they serve."""
        return []

    def child_health(self) -> ChildHealth:
        """How those child processes fare (an in-process model that starts one again
        when it dies: ``ChildHealth.down`` while none serves)."""
        return NO_CHILDREN

    # -- capabilities (override what the model has) -------------------------------------
    def infer(self, batch: Sequence[Inputs]) -> Sequence[Outputs]:
        raise NotImplementedError

    def generate(self, req: GenerateRequest) -> Iterator[Piece] | AsyncIterator[Piece]:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    # -- optional helpers the API layers use --------------------------------------------
    def count_tokens(self, text: str) -> int:
        """Number of model tokens in ``text`` (for ``usage``). Default: whitespace words."""
        return len(text.split())

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """The model's token ids of ``text`` (``add_special_tokens``: with the special
        tokens the model adds around a text it reads, such as a beginning-of-sequence).
        Override with :meth:`detokenize` where the model has a tokenizer: the server then
        serves ``/tokenize`` and ``/detokenize`` for it."""
        raise NotImplementedError

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``. A token id outside the vocabulary raises ``ValueError``."""
        raise NotImplementedError

    @classmethod
    def has_tokenizer(cls) -> bool:
        """Whether the model overrides :meth:`tokenize` and :meth:`detokenize`."""
        return cls.tokenize is not Model.tokenize and cls.detokenize is not Model.detokenize

    def chat_template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Render chat messages to a prompt. See docs/models.md for the default template."""
        parts = [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
        parts.append("<|assistant|>\n")
        return "".join(parts)

    def inputs(self) -> list[TensorSpec]:
        """V2 input metadata. Default: one variable-length UINT8 tensor named ``raw``."""
        return [TensorSpec("raw", "UINT8", (-1,))]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("raw", "UINT8", (-1,))]

    def slot_count(self) -> int:
        """Parallel sequences of an engine that schedules its own work, one blocking call
        each (llama.cpp's): the runtime gives the loaded model a pool of that many slot
        threads (docs/architecture.md, "The llama.cpp backend"). 0: none."""
        return 0

    @classmethod
    def capabilities(cls) -> frozenset[str]:
        return frozenset(c for c in CAPABILITIES if getattr(cls, c) is not getattr(Model, c))
