"""Model specs: how ``--model`` strings and config entries name a model.

``SPEC`` forms (``NAME=`` is optional where a default name exists):

* ``NAME=package.module:Class`` — a user model class (a ``zeroserve.Model`` subclass).
* ``echo`` / ``tinyllm`` / ``minilm`` / ``smollm2`` — the built-in models.
* ``NAME=onnx:/path/model.onnx`` — the onnxruntime backend.
* ``NAME=remote:https://host/v1[,https://host2/v1]`` — an OpenAI-compatible upstream.
* ``NAME=transformers:/path/to/folder`` — a Hugging Face causal LM folder (extra).
* ``NAME=llamacpp:/path/model.gguf`` — a GGUF on llama.cpp's engine, in-process.

Options follow the spec after ``?`` as ``key=value`` pairs joined by ``&``, e.g.
``llm=transformers:/models/x?executor=thread&max_batch_size=8``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from ..errors import SpecError
from .base import Model

BUILTINS: dict[str, str] = {
    "echo": "zeroserve.models.echo:EchoModel",
    "tinyllm": "zeroserve.models.tinyllm:TinyLlamaModel",
    "minilm": "zeroserve.models.minilm:MiniLMEmbedder",
    "smollm2": "zeroserve.models.llamacpp:SmolLM2Model",
}
# Backends taking a location after the colon: name -> "module:Class"; the class receives
# the location as its ``location`` option.
BACKENDS: dict[str, str] = {
    "onnx": "zeroserve.models.onnx_backend:OnnxModel",
    "remote": "zeroserve.models.remote:RemoteModel",
    "transformers": "zeroserve.models.transformers_backend:TransformersModel",
    "sentence-transformers": "zeroserve.models.sentence_transformers_backend:SentenceTransformersModel",
    "llamacpp": "zeroserve.models.llamacpp:LlamaCppModel",
}
# Targets that write the model's name into their own responses: they are told the
# served name (option ``alias``), so a response never names a file path instead.
NAMED_TARGETS = frozenset({BUILTINS["smollm2"], BACKENDS["llamacpp"]})
# Options the runtime reads (the rest go to the model's constructor).
RUNTIME_KEYS = frozenset(
    {
        "executor",
        "max_batch_size",
        "max_batch_delay_ms",
        "workers",
        "queue_depth",
        "deadline_s",
        "nice",
    }
)
# Options that place ``executor=ray`` workers; they reach the runtime as ``placement``.
# ``executor=ray-serve`` adds its deployment's autoscaling (``runtime.ray.serve``).
PLACEMENT_KEYS = frozenset(
    {"num_cpus", "num_gpus", "resources", "max_restarts", "same_node"}
    | {"min_replicas", "max_replicas", "target_ongoing_requests", "max_ongoing_requests"}
    | {"upscale_delay_s", "downscale_delay_s", "look_back_period_s", "metrics_interval_s"}
)


@dataclass
class ModelRef:
    """A model as the command line or config names it (``[NAME=]SPEC[?k=v&...]``),
    parsed but not loaded: what to import, its options and its runtime settings."""

    name: str
    target: str  # "module:Class"
    options: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)

    def factory(self) -> Callable[[], Model]:
        cls = load_class(self.target)
        options = dict(self.options)
        return lambda: cls(**options)

    def load_class(self) -> type[Model]:
        return load_class(self.target)


def parse_spec(text: str) -> ModelRef:
    """Parse ``[NAME=]SPEC[?k=v&...]``. Raises ``SpecError`` naming what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or any(c in name for c in ":/?"):
        name, rest = "", text
    rest, _, query = rest.partition("?")
    options: dict[str, Any] = {k: _coerce(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    if rest in BUILTINS:
        target = BUILTINS[rest]
        name = name or rest
    else:
        backend, colon, location = rest.partition(":")
        if backend in BACKENDS and colon:
            target = BACKENDS[backend]
            options["location"] = location
            if not name:
                raise SpecError(f"model spec {text!r}: a {backend} model needs a NAME=")
        elif colon and location and "/" not in backend:
            target = rest
            name = name or location.lower()
        else:
            raise SpecError(
                f"model spec {text!r} is not NAME=module:Class, a built-in "
                f"({', '.join(BUILTINS)}), or NAME=backend:location ({', '.join(BACKENDS)})"
            )
    runtime = {k: options.pop(k) for k in list(options) if k in RUNTIME_KEYS}
    if target in NAMED_TARGETS:
        options.setdefault("alias", name)
    placement = {k: options.pop(k) for k in list(options) if k in PLACEMENT_KEYS}
    if placement:
        runtime["placement"] = placement
    return ModelRef(name=name, target=target, options=options, runtime=runtime)


def load_class(target: str) -> type[Model]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r} for model {target!r}: {exc}") from exc
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise SpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise SpecError(f"{target!r} is not a zeroserve.Model subclass")
    return cls


def _coerce(value: str) -> Any:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value
