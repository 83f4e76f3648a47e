"""The embedded default generative model: a tiny Llama-style demo model run with numpy."""

from ._text import TextStream
from .model import CONTEXT_LENGTH, MODEL_DIR, FinishReason, TinyLlamaModel

__all__ = ["CONTEXT_LENGTH", "MODEL_DIR", "FinishReason", "TextStream", "TinyLlamaModel"]
