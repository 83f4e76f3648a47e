"""What ``/openapi.json`` says of the OpenAI routes beyond their Structs' own schemas
(``app/apidoc.py``): the real shapes of the fields kept raw, the configurable limits, the
only values served of fields OpenAI defines more widely, and the rules between fields.
Each entry is checked where the request is decoded (``chat.py``, ``responses.py``), and
the contract test (``tests/app/openai/test_contract.py``) holds the two together.
"""

from __future__ import annotations

from typing import Any

from ..apidoc import Refinement
from . import responses_schemas as r
from . import schemas as s

_NULL: dict[str, Any] = {"type": "null"}


def _only(schema: dict[str, Any], why: str) -> dict[str, Any]:
    return {**schema, "description": f"Only these values are served: {why}."}


def _null(why: str) -> dict[str, Any]:
    return _only(_NULL, why)


# A JSON Schema given raw (tool parameters, a format's schema): an object, or null.
_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "object"}, _NULL],
    "description": "A JSON Schema object, passed to the model as it came.",
}

# vLLM's min_tokens is served with ignore_eos and no stop, which imply it (app/openai/
# chat.py); its bound by max_tokens is stated in its description.
_MIN_TOKENS_RULE: dict[str, Any] = {
    "if": {
        "required": ["min_tokens"],
        "properties": {"min_tokens": {"type": "integer", "minimum": 1}},
    },
    "then": {
        "required": ["ignore_eos"],
        "properties": {"ignore_eos": {"const": True}, "stop": _NULL},
    },
}
# stream_options.continuous_usage_stats needs include_usage (vLLM's usage on every chunk).
_STREAM_OPTIONS = Refinement(
    s.StreamOptions,
    rules=(
        {
            "if": {
                "required": ["continuous_usage_stats"],
                "properties": {"continuous_usage_stats": {"const": True}},
            },
            "then": {
                "required": ["include_usage"],
                "properties": {"include_usage": {"const": True}},
            },
        },
    ),
)

# An image's URL (app/chat/images.py): what its text must be, and the limits.
_IMAGE_URL: dict[str, Any] = {
    "type": "string",
    "pattern": "^([dD][aA][tT][aA]:|[hH][tT][tT][pP][sS]?://)",
    "description": "A data: URI of base64 text (data:image/png;base64,...) of a PNG, JPEG, "
    "GIF or WebP image (as its first bytes say), at most the api limit image_bytes once "
    "decoded (413 beyond); or an http(s) URL, fetched only from the hosts the server "
    "allows (--allow-image-urls; refused otherwise). At most the api limit images per "
    "request.",
}
_STATELESS = "this server keeps no state"
_NOT_SERVED = "not served by any model here"

CHAT = (
    Refinement(
        s.ChatCompletionRequest,
        shapes={
            "tools": list[s.Tool] | None,
            "tool_choice": s.ToolChoice | None,
            "response_format": s.ResponseFormat | None,
        },
        limits={
            "messages": ("maxItems", "messages"),
            "n": ("maximum", "n"),
            "stop": ("maxItems", "stop"),
            "tools": ("maxItems", "tools"),
            "max_tokens": ("maximum", "output_tokens"),
            "max_completion_tokens": ("maximum", "output_tokens"),
        },
        rules=(
            # Tools, when given, are some: OpenAI refuses an empty list too. Their names are
            # unique and a tool choice names only tools among them (not expressible here;
            # the 400 names "tools" or "tool_choice").
            {"properties": {"tools": {"minItems": 1}}},
            {  # top_logprobs needs logprobs
                "if": {
                    "required": ["top_logprobs"],
                    "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
                },
                "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
            },
            {  # a tool choice other than none needs tools
                "if": {
                    "required": ["tool_choice"],
                    "properties": {"tool_choice": {"not": {"enum": ["none", None]}}},
                },
                "then": {"required": ["tools"], "properties": {"tools": {"type": "array"}}},
            },
            _MIN_TOKENS_RULE,
        ),
    ),
    _STREAM_OPTIONS,
    Refinement(
        s.Message,
        only={"function_call": _null("deprecated by OpenAI; send tool_calls")},
        rules=(
            {  # every turn but an assistant's carries content
                "if": {
                    "properties": {
                        "role": {"enum": ["system", "developer", "user", "tool", "function"]}
                    }
                },
                "then": {"required": ["content"], "properties": {"content": {"not": _NULL}}},
            },
        ),
    ),
    Refinement(
        s.ContentPart,
        only={
            "type": _only(
                {"enum": ["text", "image_url"]},
                "text parts; image parts in user messages, for a model whose card lists "
                "image among its input_modalities (any other refuses them by name)",
            )
        },
        rules=(
            {
                "if": {"properties": {"type": {"const": "text"}}},
                "then": {
                    "required": ["text"],
                    "properties": {"text": {"type": "string"}, "image_url": _NULL},
                },
            },
            {
                "if": {"properties": {"type": {"const": "image_url"}}},
                "then": {
                    "required": ["image_url"],
                    "properties": {"text": _NULL, "image_url": {"type": "object"}},
                },
            },
        ),
    ),
    Refinement(s.ImageUrl, only={"url": _IMAGE_URL}),
    Refinement(s.FunctionDef, only={"parameters": _SCHEMA}),
    Refinement(s.JsonSchemaFormat, only={"schema": _SCHEMA}),
    Refinement(
        s.ResponseFormat,
        rules=(
            {
                "if": {"properties": {"type": {"const": "json_schema"}}},
                "then": {
                    "required": ["json_schema"],
                    "properties": {
                        "json_schema": {
                            "required": ["schema"],
                            "properties": {"schema": {"type": "object"}},
                        }
                    },
                },
            },
        ),
    ),
)

COMPLETIONS = (
    Refinement(
        s.CompletionRequest,
        limits={
            "prompt": ("maxItems", "prompts"),
            "n": ("maximum", "n"),
            "stop": ("maxItems", "stop"),
            "max_tokens": ("maximum", "output_tokens"),
        },
        only={
            "prompt": _only(
                {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    ]
                },
                "text prompts; token arrays are not served",
            ),
            "echo": _only({"enum": [False, None]}, "false; " + _NOT_SERVED),
            "suffix": _null(_NOT_SERVED),
            "best_of": _only({"enum": [1, None]}, "1; " + _NOT_SERVED),
        },
        rules=(_MIN_TOKENS_RULE,),
    ),
    _STREAM_OPTIONS,
)

EMBEDDINGS = (Refinement(s.EmbeddingRequest, limits={"input": ("maxItems", "embedding_inputs")}),)

RESPONSES = (
    Refinement(
        r.ResponsesRequest,
        shapes={"tools": list[r.FunctionToolIn] | None, "tool_choice": r.ToolChoiceIn | None},
        limits={
            "input": ("maxItems", "messages"),
            "tools": ("maxItems", "tools"),
            "max_output_tokens": ("maximum", "output_tokens"),
        },
        rules=(
            {  # a tool choice other than none needs tools
                "if": {
                    "required": ["tool_choice"],
                    "properties": {"tool_choice": {"not": {"enum": ["none", None]}}},
                },
                "then": {
                    "required": ["tools"],
                    "properties": {"tools": {"type": "array", "minItems": 1}},
                },
            },
        ),
        only={
            "previous_response_id": _null(_STATELESS),
            "conversation": _null(_STATELESS),
            "prompt": _null(_STATELESS),
            "background_options": _null(_STATELESS),
            "store": _only({"enum": [False, None]}, "false; " + _STATELESS),
            "background": _only({"enum": [False, None]}, "false; " + _STATELESS),
            "include": _only({"anyOf": [{"type": "array", "maxItems": 0}, _NULL]}, _NOT_SERVED),
            "reasoning": _null("the models here do not reason"),
            "top_logprobs": _only({"enum": [0, None]}, "0; " + _NOT_SERVED),
            "truncation": _only({"enum": ["disabled", None]}, "disabled; " + _NOT_SERVED),
            "context_management": _null(_NOT_SERVED),
            "moderation": _null(_NOT_SERVED),
            "access_programs": _null(_NOT_SERVED),
            "image": _null(_NOT_SERVED),
        },
    ),
    Refinement(
        r.TextConfig,
        only={"verbosity": _only({"enum": ["medium", None]}, "medium; " + _NOT_SERVED)},
    ),
    Refinement(r.FunctionToolIn, only={"parameters": _SCHEMA}),
    Refinement(
        r.TextFormat,
        only={"schema": _SCHEMA},
        rules=(
            {
                "if": {"properties": {"type": {"const": "json_schema"}}},
                "then": {"required": ["schema"], "properties": {"schema": {"type": "object"}}},
            },
        ),
    ),
    Refinement(
        r.InputItem,
        only={
            "type": _only(
                {"enum": ["message", "function_call", "function_call_output"]},
                "messages and an agent loop's function calls and their outputs",
            )
        },
        rules=(
            {
                "if": {"properties": {"type": {"const": "message"}}},
                "then": {
                    "required": ["role", "content"],
                    "properties": {"role": {"not": _NULL}, "content": {"not": _NULL}},
                },
            },
            {
                "if": {"required": ["type"], "properties": {"type": {"const": "function_call"}}},
                "then": {
                    "required": ["call_id", "name", "arguments"],
                    "properties": {
                        "call_id": {"type": "string"},
                        "name": {"type": "string"},
                        "arguments": {"type": "string"},
                    },
                },
            },
            {
                "if": {
                    "required": ["type"],
                    "properties": {"type": {"const": "function_call_output"}},
                },
                "then": {
                    "required": ["call_id", "output"],
                    "properties": {"call_id": {"type": "string"}, "output": {"not": _NULL}},
                },
            },
        ),
    ),
    Refinement(
        r.InputPart,
        only={
            "type": _only(
                {"enum": ["input_text", "output_text", "input_image"]},
                "text parts; input_image in user messages, for a model whose card lists "
                "image among its input_modalities",
            ),
            "image_url": _IMAGE_URL,
            "file_id": _null("this server keeps no files; send image_url"),
        },
        rules=(
            {
                "if": {"properties": {"type": {"enum": ["input_text", "output_text"]}}},
                "then": {
                    "required": ["text"],
                    "properties": {
                        "text": {"type": "string"},
                        "image_url": _NULL,
                        "detail": _NULL,
                        "file_id": _NULL,
                    },
                },
            },
            {
                "if": {"required": ["type"], "properties": {"type": {"const": "input_image"}}},
                "then": {
                    "required": ["image_url"],
                    "properties": {"text": _NULL, "image_url": {"type": "string"}},
                },
            },
        ),
    ),
)
