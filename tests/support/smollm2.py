"""The built-in ``smollm2`` (SmolLM2-135M GGUF on llama.cpp's engine) for tests, in one
place: as an in-thread server's model config, as a ``--model`` argument of a process
server, and as a loaded model. Its tests skip, saying why, where ``xllamacpp`` is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from zeroserve.models.llamacpp import SmolLM2Model
from zeroserve.runtime import ModelConfig

NAME = "smollm2"
# Two slots and a 1,024-token context: enough for two concurrent short chats, and loads in
# about a second. A test that needs more (or less) says so.
PARALLEL = 2
N_CTX = 1024


def require_llamacpp() -> None:
    """Skip the calling module (or test) where llama.cpp's engine is not installed."""
    pytest.importorskip("xllamacpp")


def smollm2_options(*, parallel: int = PARALLEL, n_ctx: int = N_CTX, **more: Any) -> dict[str, Any]:
    """The model options, in the order a ``--model`` argument writes them."""
    return {"parallel": parallel, "n_ctx": n_ctx, **more}


def smollm2_config(name: str = NAME, **options: Any) -> ModelConfig:
    """``smollm2`` as a model of an in-thread server (``tests.support.ServerThread``)."""
    return ModelConfig(name, SmolLM2Model, options={**smollm2_options(**options), "alias": name})


def smollm2_arg(**options: Any) -> str:
    """``smollm2`` as the value of a process server's ``--model`` argument."""
    query = "&".join(f"{key}={value}" for key, value in smollm2_options(**options).items())
    return f"{NAME}?{query}"


def loaded_smollm2(**options: Any) -> Iterator[SmolLM2Model]:
    """A loaded ``SmolLM2Model`` for a fixture to yield (no server: for request building)."""
    require_llamacpp()
    model = SmolLM2Model(**smollm2_options(**options))
    model.load()
    yield model
