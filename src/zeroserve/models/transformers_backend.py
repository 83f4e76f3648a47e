"""The Hugging Face transformers backend: ``--model NAME=transformers:/path/to/folder``.

A local causal-LM folder (``config.json``, weights, tokenizer files, optionally a chat
template) loaded with ``AutoModelForCausalLM`` / ``AutoTokenizer``; nothing is downloaded
(``local_files_only``). Needs the ``transformers`` extra (torch, transformers).

Strategy
--------
``generate`` is a synchronous generator that decodes one token per ``next()``: a prefill
forward pass over the prompt, then one forward pass per token with the model's KV cache
(``past_key_values``). Each token's text is yielded as soon as it is complete UTF-8 (a
character split over several tokens comes out whole), so the server streams it at once.
The finish reason is the generator's return value, as for ``tinyllm``: ``"stop"`` on an
end-of-sequence token or a stop string, ``"length"`` at ``max_tokens`` or a full context.

Why the ``thread`` executor
---------------------------
A decode step is a few hundred small torch ops. Each op releases the GIL while its kernel
runs and takes it back to return to Python. Run ``inline``, the whole step would block the
event loop. On a thread, the loop keeps serving while kernels run, and the step only
competes for the GIL between ops: with a Python-busy thread next to it, every retake can
wait up to ``sys.getswitchinterval()`` (5 ms), so the step slows down, yet the server stays
responsive and nothing is copied across a process boundary. (For CPU-bound Python next
to a large model, ``?executor=process`` isolates it completely.) This is measurable:
every decode step records its wall time and the thread's CPU time
(``time.thread_time``); ``statistics()`` reports both, and ``wall - cpu`` is the time
the step spent waiting, mostly for the GIL. ``tests/models/test_transformers_backend.py``
shows the wait growing when a Python-busy thread runs alongside.

Options: ``location`` (the folder, from the spec), ``torch_threads`` (intra-op threads,
default 1: requests run side by side instead), ``dtype`` (``float32`` default,
``bfloat16``, ``float16``).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from .base import ExecutorKind, GenerateRequest, Model

FinishReason = Literal["stop", "length"]

# One intra-op thread per model by default: the server runs several generations at once,
# and torch's default (one thread per core) would oversubscribe the cores under load.
DEFAULT_TORCH_THREADS = 1


@dataclass(frozen=True, slots=True)
class StepStatistics:
    """Decode steps so far: ``wait_s = wall_s - cpu_s`` is time spent off the CPU
    (waiting for the GIL or for a core)."""

    steps: int
    wall_s: float
    cpu_s: float

    @property
    def wait_s(self) -> float:
        return max(0.0, self.wall_s - self.cpu_s)


class TransformersModel(Model):
    """A local Hugging Face causal language model, streamed token by token."""

    executor: ClassVar[ExecutorKind] = "thread"
    description: ClassVar[str] = "Hugging Face causal LM (transformers backend)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        location = options.get("location") or options.get("path")
        if not location:
            raise ValueError("the transformers backend needs a model folder (location)")
        self.path = Path(str(location))
        self.description = f"Hugging Face causal LM from {self.path.name} (transformers)"  # type: ignore[misc]
        self.torch_threads = int(options.get("torch_threads", DEFAULT_TORCH_THREADS))
        self.dtype = str(options.get("dtype", "float32"))
        self._model: Any = None
        self._tokenizer: Any = None
        self._end_ids: frozenset[int] = frozenset()
        self._cache_kw = "past_key_values"
        self._lock = threading.Lock()
        self._steps = 0
        self._wall = 0.0
        self._cpu = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not self.path.is_dir():
            raise FileNotFoundError(f"no model folder at {self.path}")
        torch.set_num_threads(self.torch_threads)
        tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(self.path), local_files_only=True, dtype=getattr(torch, self.dtype)
        )
        model.eval()  # type: ignore[no-untyped-call]
        end = set()
        for source in (model.generation_config, model.config, tok):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                end.add(eos)
            elif isinstance(eos, list | tuple):
                end.update(int(e) for e in eos)
        self._end_ids = frozenset(end)
        ctx = getattr(model.config, "max_position_embeddings", None)
        self.context_length = int(ctx) if ctx else None  # type: ignore[misc]
        # transformers 5.x renamed ``past_key_values`` to ``cache`` in forward().
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._model = model
        self._tokenizer = tok

    # -- capabilities ------------------------------------------------------------------
    def generate(self, req: GenerateRequest) -> Generator[str, None, FinishReason]:
        import torch

        model, tok = self._loaded()
        ctx = self.context_length
        ids = list(self._encode(req.prompt)) or [next(iter(self._end_ids), 0)]
        if ctx is not None and len(ids) > ctx - 1:
            ids = ids[len(ids) - (ctx - 1) :]
        limit = req.max_tokens if req.max_tokens is not None else (ctx or 2048) - len(ids)
        if limit <= 0:
            return "length"
        gen = None
        if req.temperature > 0:
            gen = torch.Generator().manual_seed(req.seed if req.seed is not None else torch.seed())
        out_ids: list[int] = []
        emitted = 0  # characters of the decoded completion already yielded
        text = ""
        with torch.inference_mode():
            t0, c0 = time.perf_counter(), time.thread_time()
            result = model(torch.tensor([ids]), use_cache=True)
            self._record(t0, c0)
            past = _cache_of(result)
            logits = result.logits[0, -1]
            while True:
                token = _sample(logits, req.temperature, req.top_p, gen)
                if token in self._end_ids:
                    return "stop"
                out_ids.append(token)
                text = tok.decode(out_ids, skip_special_tokens=True)
                # Hold back an incomplete UTF-8 character (decoded as U+FFFD).
                ready = len(text) - 1 if text.endswith("\ufffd") else len(text)
                if ready > emitted:
                    piece = text[emitted:ready]
                    emitted = ready
                    yield piece
                if req.stop and any(s and s in text for s in req.stop):
                    return "stop"
                if len(out_ids) >= limit or (ctx is not None and len(ids) + len(out_ids) >= ctx):
                    if len(text) > emitted:
                        yield text[emitted:]
                    return "length"
                t0, c0 = time.perf_counter(), time.thread_time()
                kw = {self._cache_kw: past}
                result = model(torch.tensor([[token]]), use_cache=True, **kw)
                self._record(t0, c0)
                past = _cache_of(result)
                logits = result.logits[0, -1]

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def chat_template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The folder's own chat template (``tokenizer.chat_template``) if it has one,
        else zeroserve's default (``Model.chat_template``)."""
        tok = self._tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            rendered: str = tok.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
            return rendered
        return super().chat_template(messages)

    def statistics(self) -> StepStatistics:
        with self._lock:
            return StepStatistics(self._steps, self._wall, self._cpu)

    # -- helpers -----------------------------------------------------------------------
    def _record(self, t0: float, c0: float) -> None:
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        with self._lock:
            self._steps += 1
            self._wall += wall
            self._cpu += cpu

    def _loaded(self) -> tuple[Any, Any]:
        if self._model is None:
            raise RuntimeError("TransformersModel.load() was not called")
        return self._model, self._tokenizer

    def _encode(self, text: str) -> list[int]:
        _, tok = self._loaded()
        ids: list[int] = tok(text, add_special_tokens=False)["input_ids"]
        return ids


def _cache_of(result: Any) -> Any:
    cache = getattr(result, "past_key_values", None)
    return cache if cache is not None else getattr(result, "cache", None)


def _sample(logits: Any, temperature: float, top_p: float, gen: Any) -> int:
    import torch

    if gen is None or temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        keep = int(torch.searchsorted(cum, torch.tensor(max(top_p, 0.0)))) + 1
        sorted_p = sorted_p[:keep]
        choice = int(torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen))
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))
