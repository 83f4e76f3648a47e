"""KServe V2 / Open Inference Protocol REST bodies as msgspec Structs.

Field names and optionality follow the protocol's REST specification
(``kserve/open-inference-protocol``, ``inference_rest.md``) and Triton's binary tensor data
extension. Unknown fields are ignored (clients add ``model_name`` and the like), so only
what the server reads is declared. Decoders and encoders are built once and reused.
"""

from __future__ import annotations

from typing import Any

import msgspec

# Parameter values are a string, a number or a boolean (the protocol's $parameter).
Parameters = dict[str, Any]


class RequestInput(msgspec.Struct, kw_only=True):
    """``$request_input``. ``data`` is absent when ``parameters.binary_data_size`` says the
    tensor follows the JSON header as raw bytes."""

    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: Any = None


class RequestOutput(msgspec.Struct, kw_only=True):
    """``$request_output``: ``parameters.binary_data`` asks for the output in binary."""

    name: str
    parameters: Parameters | None = None


class InferenceRequest(msgspec.Struct, kw_only=True):
    """``$inference_request``."""

    inputs: list[RequestInput]
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[RequestOutput] | None = None


class ResponseOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``$response_output``: ``data`` for JSON outputs, ``parameters.binary_data_size``
    for binary ones (then ``data`` is omitted)."""

    name: str
    datatype: str
    shape: list[int]
    parameters: Parameters | None = None
    data: Any = None


class InferenceResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``$inference_response``. ``id`` is present only when the request gave one."""

    model_name: str
    outputs: list[ResponseOutput]
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None


class MetadataTensor(msgspec.Struct):
    """``$metadata_tensor``: ``-1`` marks a variable-size dimension."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct, kw_only=True):
    """``$metadata_model_response``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ServerMetadata(msgspec.Struct):
    """``$metadata_server_response``."""

    name: str
    version: str
    extensions: list[str]


class ModelReady(msgspec.Struct):
    name: str
    ready: bool


request_decoder = msgspec.json.Decoder(InferenceRequest)
encoder = msgspec.json.Encoder()
