"""The suite's one set of test models, importable by name from the repository root (process
workers and Ray actors load them as ``tests.support.models.<module>:<Class>``):

* ``engine``: small models of every capability for the runtime's engine tests (gates and
  counters shared with spawned workers through ``multiprocessing`` objects);
* ``streams``: streams a test steers (a gate, an endless stream whose close it observes, one
  that fails mid-stream);
* ``misbehaving``: models that stall, hang their thread or process, or crash their worker;
* ``raw``: raw-body models of the server tests (reverse, embed-only, lines, fails to load);
* ``kserve``: a V2 probe that reports zero-copy inputs, and a file-gated identity;
* ``onnx_graphs``: small ONNX graphs built in the test, with their numpy references;
* ``ray_actors``: models for the Ray suite, observed through files;
* ``hanging``: work that hangs until released or killed, for the abandoned-work suites;
* ``batch``: a generation gated by a FIFO, across restarts, for the Batch API suite.

The model sets the in-thread servers of several suites share are here too.
"""

from __future__ import annotations

from tests.support.models.misbehaving import StallModel
from tests.support.models.streams import EndlessModel, FailingModel, GatedModel
from zeroserve.models.echo import EchoModel
from zeroserve.models.minilm import MiniLMEmbedder
from zeroserve.models.tinyllm import TinyLlamaModel
from zeroserve.runtime import ModelConfig


def default_configs() -> dict[str, ModelConfig]:
    """The default models (``echo``, ``tinyllm``, ``minilm``), ``tinyllm`` again on the
    ``inline`` executor, and the steered streams."""
    return {
        "echo": ModelConfig("echo", EchoModel),
        "tinyllm": ModelConfig("tinyllm", TinyLlamaModel),
        "minilm": ModelConfig("minilm", MiniLMEmbedder),
        "tinyllm-inline": ModelConfig("tinyllm-inline", TinyLlamaModel, executor="inline"),
        "gated": ModelConfig("gated", GatedModel),
        "endless": ModelConfig("endless", EndlessModel, queue_depth=1),
        "failing": ModelConfig("failing", FailingModel),
    }


def process_configs() -> dict[str, ModelConfig]:
    """``tinyllm`` on a process worker (its own server, so only its tests depend on it)."""
    return {"tinyllm-process": ModelConfig("tinyllm-process", TinyLlamaModel, executor="process")}


def strict_configs() -> dict[str, ModelConfig]:
    """``echo`` and a model that never answers, for a server with a short deadline."""
    return {"echo": ModelConfig("echo", EchoModel), "stall": ModelConfig("stall", StallModel)}
