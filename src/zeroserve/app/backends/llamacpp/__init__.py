"""The ``llamacpp`` backend: llama.cpp's engine, in-process (docs/architecture.md, "The
llama.cpp backend")."""

from .backend import LlamaCppBackend, LlamaCppEngine

__all__ = ["LlamaCppBackend", "LlamaCppEngine"]
