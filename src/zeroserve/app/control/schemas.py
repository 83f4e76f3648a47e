"""The model control routes' bodies: llama.cpp router's and the KServe V2 repository
extension's (Triton's), as msgspec Structs (the OpenAPI document is written from them)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from ..openai.schemas import ModelLoadStatus


class RouterModel(Struct, omit_defaults=True):
    """One catalog model as llama.cpp's router lists it (``GET /models``)."""

    id: str
    object: Literal["model"]
    owned_by: str
    status: ModelLoadStatus
    pinned: bool = False


class RouterModelList(Struct):
    object: Literal["list"]
    data: list[RouterModel]


class RouterModelRequest(Struct, forbid_unknown_fields=True):
    """``POST /models/load`` and ``/models/unload``: the catalog model's name."""

    model: str


class RouterAnswer(Struct):
    success: bool


class PullRequest(Struct, forbid_unknown_fields=True):
    """``POST /models/pull``: ``model`` is the pull source (``hf:ORG/REPO[:FILE]`` or
    ``https://...``, optionally ``?sha256=HEX``); ``name`` the catalog name (default:
    the file's stem)."""

    model: str
    name: str | UnsetType = UNSET


class PullAnswer(Struct):
    """The pulled model's catalog name; it is ``unloaded`` until a load serves it."""

    success: bool
    model: str


class RepositoryIndexRequest(Struct, forbid_unknown_fields=True):
    """``POST /v2/repository/index``: ``ready`` true lists only the loaded models (the
    body may also be empty, as tritonclient sends it)."""

    ready: bool = False


class RepositoryModel(Struct, omit_defaults=True):
    """One model of the repository index, in Triton's states: ``UNAVAILABLE`` (not
    loaded; ``reason`` says why when a load failed), ``LOADING``, ``READY``,
    ``UNLOADING``."""

    name: str
    state: Literal["UNAVAILABLE", "LOADING", "READY", "UNLOADING"]
    version: str | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class RepositoryLoadParameters(Struct, forbid_unknown_fields=True):
    """Nothing is accepted: a load names a catalog model, and a configuration or files
    sent with it (Triton's ``config`` and ``file:`` parameters) are never used."""


class RepositoryLoadRequest(Struct, forbid_unknown_fields=True):
    parameters: RepositoryLoadParameters | UnsetType = UNSET


class RepositoryUnloadParameters(Struct, forbid_unknown_fields=True):
    """``unload_dependents``: accepted either way (a model here has no dependents)."""

    unload_dependents: bool = False


class RepositoryUnloadRequest(Struct, forbid_unknown_fields=True):
    parameters: RepositoryUnloadParameters | UnsetType = UNSET


encoder = msgspec.json.Encoder()


def decoder(t: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(t)
