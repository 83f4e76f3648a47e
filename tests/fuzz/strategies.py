"""Hypothesis strategies for hostile request bodies, one family per decoder.

Each body strategy mixes three kinds of input, because each finds different bugs:
near-valid documents whose fields take hostile values (huge, negative, wrong-typed,
deeply nested), arbitrary JSON, and arbitrary or mangled bytes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from hypothesis import strategies as st

from zeroserve.app import limits as lim

# Integers at and around every boundary the server has, plus the int64 / uint64 edges.
EDGE_INTS = [
    0, 1, -1, 2, 4, 5, 16, 20, 64, 128, 129, 2048, 2049,
    lim.MAX_OUTPUT_TOKENS + 1, lim.MAX_TOKENS, lim.MAX_TOKENS + 1,
    lim.MAX_DIMENSIONS, lim.MAX_DIMENSIONS + 1,
    2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**59, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
    -(2**63), -(2**63) - 1, 10**26, -(10**26), 10**400,
]  # fmt: skip

ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70), st.integers(-3, 70))
# Counts that stay cheap for the echo model (so examples run fast), or that are out of
# every range or budget (a valid but huge ``max_tokens`` x ``n`` is slow work, not hostile
# input).
OUT_OF_RANGE = [v for v in EDGE_INTS if v < 0 or v > lim.MAX_OUTPUT_TOKENS]
small_ints = st.one_of(st.integers(0, 8), st.sampled_from(OUT_OF_RANGE))
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-300, 1e308, -1e308, 2.0000001, 0.5]),
)
text = st.text(max_size=40)
json_leaf = st.one_of(st.none(), st.booleans(), ints, floats, text)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(text, inner, max_size=5)),
    max_leaves=25,
)


def hostile(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: mostly a valid one, else anything JSON can hold."""
    return st.one_of(valid, valid, json_value)


_DEPTHS = st.one_of(st.integers(1, 70), st.integers(900, 1100), st.integers(5000, 100_000))


def nested() -> st.SearchStrategy[str]:
    """Deeply nested arrays or objects, closed or not."""
    return st.builds(
        lambda d, opener, closed: (opener * d) + ("]" * d if closed and opener == "[" else ""),
        _DEPTHS,
        st.sampled_from(["[", '{"a":']),
        st.booleans(),
    )


def optional_fields(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


def near_valid(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]],
    wild: dict[str, st.SearchStrategy[Any]],
    never_null: frozenset[str] = frozenset(),
) -> st.SearchStrategy[dict[str, Any]]:
    """A valid document (it reaches the model: generation, streaming, encoding), or one
    with exactly one field made hostile (``wild``, or any JSON; never null for the keys
    in ``never_null``, where null means unbounded work). With every field drawn hostile
    at once, nearly every document is refused by its first bad field and the code behind
    the decoder is never reached."""
    valid = st.fixed_dictionaries(required, optional=optional)

    @st.composite
    def one_off(draw: st.DrawFn) -> dict[str, Any]:
        doc = draw(valid)
        key = draw(st.sampled_from(sorted(wild)))
        value = st.one_of(wild[key], json_value)
        if key in never_null:
            value = value.filter(lambda v: v is not None)
        doc[key] = draw(value)
        return doc

    return st.one_of(valid, one_off())


def _messages() -> st.SearchStrategy[Any]:
    role = st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"])
    part = optional_fields(type=hostile(st.sampled_from(["text", "image_url"])), text=hostile(text))
    content = st.one_of(text, st.none(), st.lists(hostile(part), max_size=3))
    message = optional_fields(role=hostile(role), content=hostile(content), name=hostile(text))
    too_many = [{"role": "user", "content": "a"}] * (lim.MAX_MESSAGES + 1)
    return st.one_of(st.lists(hostile(message), max_size=4), st.just(too_many))


def _stop() -> st.SearchStrategy[Any]:
    return st.one_of(text, st.lists(text, max_size=6))


_sampling = {
    "stop": hostile(_stop()),
    "temperature": hostile(floats),
    "top_p": hostile(floats),
    "seed": hostile(ints),
    "n": hostile(st.one_of(st.integers(0, 4), st.sampled_from([129, *OUT_OF_RANGE]))),
    "stream": hostile(st.booleans()),
    "stream_options": hostile(optional_fields(include_usage=hostile(st.booleans()))),
}
_models = st.sampled_from(["echo", "echo-thread", "nope", ""])
_served = st.sampled_from(["echo", "echo-thread"])
# Valid values of the fields every generating route shares (kept cheap for echo).
_valid_sampling = {
    "stop": st.one_of(text, st.lists(text, max_size=lim.MAX_STOP)),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "seed": st.integers(lim.SEED_MIN, lim.SEED_MAX),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stream_options": optional_fields(include_usage=st.booleans()),
}
_valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": text}
)

# JSON schemas (tool parameters, response_format): near-valid, wrong-typed or recursive.
_schema = st.recursive(
    optional_fields(
        type=hostile(st.sampled_from(["object", "string", "integer", "array", "null", "x"])),
        enum=st.lists(json_leaf, max_size=3),
        pattern=hostile(st.sampled_from(["^a+$", "(", "[", "\\", "a{99999}"])),
    ),
    lambda inner: optional_fields(
        type=st.just("object"),
        properties=st.dictionaries(text, inner, max_size=3),
        required=hostile(st.lists(text, max_size=3)),
        items=hostile(inner),
        additionalProperties=hostile(st.booleans()),
        anyOf=st.lists(inner, max_size=2),
    ),
    max_leaves=8,
)
_function = optional_fields(
    name=hostile(st.sampled_from(["get_weather", "", "a b", "x" * 65, "ünï"])),
    description=hostile(text),
    parameters=hostile(_schema),
    strict=hostile(st.booleans()),
)
_tool = optional_fields(
    type=hostile(st.sampled_from(["function", "code_interpreter"])), function=hostile(_function)
)
_ONE_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_tools = st.one_of(st.lists(hostile(_tool), max_size=3), st.just([_ONE_TOOL] * (lim.MAX_TOOLS + 1)))
_named_choice = optional_fields(
    type=hostile(st.just("function")),
    function=hostile(optional_fields(name=hostile(st.sampled_from(["f", "get_weather", ""])))),
)
_tool_choice = st.one_of(
    st.sampled_from(["auto", "none", "required", "any"]),
    _named_choice,
    optional_fields(
        type=hostile(st.just("allowed_tools")),
        allowed_tools=hostile(
            optional_fields(
                mode=hostile(st.sampled_from(["auto", "required", "none"])),
                tools=hostile(st.lists(hostile(_named_choice), max_size=3)),
            )
        ),
    ),
)
_response_format = optional_fields(
    type=hostile(st.sampled_from(["text", "json_object", "json_schema", "xml"])),
    json_schema=hostile(
        optional_fields(name=hostile(text), schema=hostile(_schema), strict=hostile(st.booleans()))
    ),
)
_chat_extra = {
    "tools": hostile(_tools),
    "tool_choice": hostile(_tool_choice),
    "parallel_tool_calls": hostile(st.booleans()),
    "response_format": hostile(_response_format),
    "top_logprobs": hostile(small_ints),
    "logit_bias": hostile(st.dictionaries(st.one_of(text, ints.map(str)), floats, max_size=4)),
    "user": hostile(text),
}
# Sometimes a parameter no API has (refused by name); rarely, so the rest gets through.
_unknown = st.one_of(
    st.just({}), st.just({}), st.just({}), st.fixed_dictionaries({"frobnicate": json_value})
)


def _with_unknown(doc: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda d, extra: {**d, **extra}, doc, _unknown)


def _chat_wild(models: st.SearchStrategy[str]) -> dict[str, st.SearchStrategy[Any]]:
    return {
        "model": models,
        "messages": _messages(),
        "max_tokens": small_ints,
        "max_completion_tokens": small_ints,
        "logprobs": st.booleans(),
        **_sampling,
        **_chat_extra,
    }


def chat_bodies() -> st.SearchStrategy[Any]:
    wild = _chat_wild(_models)
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    valid = near_valid(
        {"model": _served, "messages": st.lists(_valid_message, min_size=1, max_size=3)},
        {
            "max_tokens": st.integers(1, 8),
            "max_completion_tokens": st.integers(1, 8),
            "logprobs": st.just(False),  # echo has none to give
            "user": text,
            **_valid_sampling,
        },
        wild,
    )
    return documents(_with_unknown(st.one_of(valid, doc)))


# The SDKs' timeout headers (seconds): valid, tiny, malformed (ignored, never a 400).
sdk_timeouts = st.fixed_dictionaries(
    {},
    optional={
        "x-stainless-timeout": st.one_of(
            st.sampled_from(["600", "0.001", "0", "-1", "nan", "inf", "1e400", "soon", ""]),
            floats.map(str),
        ),
        "x-stainless-read-timeout": st.sampled_from(["60", "0.000001", "abc", "-0"]),
    },
)


def _completion_wild(models: st.SearchStrategy[str]) -> dict[str, st.SearchStrategy[Any]]:
    prompt = st.one_of(
        text,
        st.lists(text, max_size=4),
        st.lists(ints, max_size=4),
        st.lists(st.lists(ints, max_size=3), max_size=3),
        st.just(["a"] * (lim.MAX_PROMPTS + 1)),
    )
    return {
        "model": models,
        "prompt": prompt,
        "max_tokens": small_ints,
        "echo": st.booleans(),
        "logprobs": small_ints,
        "best_of": small_ints,
        "suffix": text,
        **_sampling,
    }


def completion_bodies() -> st.SearchStrategy[Any]:
    wild = _completion_wild(_models)
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    valid = near_valid(
        {"model": _served, "prompt": st.one_of(text, st.lists(text, min_size=1, max_size=3))},
        {"max_tokens": st.integers(0, 8), "echo": st.booleans(), **_valid_sampling},
        wild,
    )
    return documents(st.one_of(valid, doc))


# -- the llama.cpp engine's own decoders (``smollm2``) ------------------------------------
# Valid requests run the real model, so they ask for one or two tokens and choices, and
# always say how many (an absent or null ``max_tokens`` generates to the end of the
# context; a bigger one than the context is refused).
_TOKEN_KEYS = frozenset({"max_tokens", "max_completion_tokens"})
_engine_models = st.sampled_from(["smollm2", "smollm2", "nope"])
_valid_schema = st.sampled_from(
    [
        {"type": "object"},
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"type": "string", "enum": ["x", "y"]},
    ]
)
_engine_sampling = {
    **_valid_sampling,
    "n": st.integers(1, 2),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=2),
}


def engine_chat_bodies() -> st.SearchStrategy[Any]:
    wild = _chat_wild(_engine_models)
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    tool = st.builds(
        lambda schema: {"type": "function", "function": {"name": "f", "parameters": schema}},
        _valid_schema,
    )
    valid = near_valid(
        {
            "model": st.just("smollm2"),
            "messages": st.lists(_valid_message, min_size=1, max_size=2),
            "max_tokens": st.integers(1, 2),
        },
        {
            **_engine_sampling,
            "logprobs": st.booleans(),
            "top_logprobs": st.integers(0, 3),
            "response_format": st.one_of(
                st.just({"type": "json_object"}),
                st.builds(
                    lambda schema: {
                        "type": "json_schema",
                        "json_schema": {"name": "s", "schema": schema},
                    },
                    _valid_schema,
                ),
            ),
            "tools": st.lists(tool, min_size=1, max_size=2),
            "tool_choice": st.sampled_from(["auto", "none", "required"]),
        },
        wild,
        _TOKEN_KEYS,
    )
    return documents(_with_unknown(st.one_of(valid, valid, doc)))


def engine_completion_bodies() -> st.SearchStrategy[Any]:
    wild = _completion_wild(_engine_models)
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    valid = near_valid(
        {"model": st.just("smollm2"), "prompt": text, "max_tokens": st.integers(0, 2)},
        {**_engine_sampling, "logprobs": st.integers(0, 3)},
        wild,
        _TOKEN_KEYS,
    )
    return documents(st.one_of(valid, valid, doc))


_responses_tool = st.builds(
    lambda name, schema: {"type": "function", "name": name, "parameters": schema},
    st.sampled_from(["f", "get_weather"]),
    _valid_schema,
)
_responses_item = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": text},
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.sampled_from(["c1", "c2"]),
            "name": st.just("f"),
            "arguments": st.sampled_from(["{}", '{"a": 1}', "{", ""]),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.just("c1"), "output": text}
    ),
)


def engine_responses_bodies() -> st.SearchStrategy[Any]:
    """``/v1/responses`` on the engine: text or item inputs (messages, the agent loop's
    ``function_call`` and ``function_call_output``), function tools and every
    ``tool_choice`` form, near-valid or hostile."""
    wild = {
        "model": _engine_models,
        "input": st.one_of(text, st.lists(json_value, max_size=3)),
        "instructions": text,
        "max_output_tokens": small_ints,
        "tools": st.lists(st.one_of(_responses_tool, json_value), max_size=3),
        "tool_choice": json_value,
        "parallel_tool_calls": json_value,
        "max_tool_calls": ints,
        "text": json_value,
        "stream": st.booleans(),
        "store": json_value,
        "temperature": floats,
    }
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    valid = near_valid(
        {
            "model": st.just("smollm2"),
            "input": st.one_of(text, st.lists(_responses_item, min_size=1, max_size=3)),
            "max_output_tokens": st.integers(16, 18),
        },
        {
            "instructions": text,
            "stream": st.booleans(),
            "tools": st.lists(_responses_tool, min_size=1, max_size=2),
            "tool_choice": st.one_of(
                st.sampled_from(["auto", "none", "required"]),
                st.just({"type": "function", "name": "f"}),
                st.builds(
                    lambda mode, names: {
                        "type": "allowed_tools",
                        "mode": mode,
                        "tools": [{"type": "function", "name": n} for n in names],
                    },
                    st.sampled_from(["auto", "required"]),
                    st.lists(st.sampled_from(["f", "get_weather", "other"]), max_size=2),
                ),
            ),
            "parallel_tool_calls": st.booleans(),
            "max_tool_calls": st.integers(1, 2),
            "text": st.just({"format": {"type": "json_object"}}),
            "temperature": st.floats(0, 2),
        },
        wild,
        frozenset({"max_output_tokens"}),
    )
    return documents(_with_unknown(st.one_of(valid, valid, doc)))


def embedding_bodies() -> st.SearchStrategy[Any]:
    inputs = st.one_of(
        text,
        st.lists(text, max_size=6),
        st.lists(ints, max_size=4),
        st.sampled_from([[""] * lim.MAX_EMBEDDING_INPUTS, [""] * (lim.MAX_EMBEDDING_INPUTS + 1)]),
    )
    wild = {
        "model": _models,
        "input": inputs,
        "encoding_format": st.sampled_from(["float", "base64", "int8"]),
        "dimensions": small_ints,
        "user": text,
    }
    doc = st.fixed_dictionaries({}, optional={k: hostile(v) for k, v in wild.items()})
    valid = near_valid(
        {"model": _served, "input": st.one_of(text, st.lists(text, min_size=1, max_size=4))},
        {
            "encoding_format": st.sampled_from(["float", "base64"]),
            "dimensions": st.integers(1, 64),
        },
        wild,
    )
    return documents(st.one_of(valid, doc))


def documents(doc: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """A document as JSON bytes, or mangled: truncated, spliced with nesting, or noise."""
    as_json = doc.map(lambda d: json.dumps(d).encode())
    truncated = st.builds(lambda b, cut: b[: max(0, len(b) - cut)], as_json, st.integers(1, 20))
    spliced = st.builds(
        lambda b, deep, at: b[:at] + deep.encode() + b[at:],
        as_json,
        nested(),
        st.integers(0, 40),
    )
    return st.one_of(
        as_json,
        as_json,
        as_json,
        truncated,
        spliced,
        json_value.map(lambda v: json.dumps(v).encode()),
        nested().map(str.encode),
        st.binary(max_size=64),
    )


# -- KServe V2 --------------------------------------------------------------------------
DATATYPES = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES", "BF16", "fp32", "",
]  # fmt: skip
shapes = st.one_of(
    st.lists(st.integers(0, 4), max_size=4),
    st.lists(st.sampled_from(EDGE_INTS), max_size=4),
    st.lists(st.integers(0, 1), min_size=30, max_size=70),
)
_params = optional_fields(
    binary_data_output=hostile(st.booleans()),
    timeout=hostile(st.one_of(st.integers(0, 2_000_000), st.sampled_from(EDGE_INTS))),
    anything=json_value,
)


def _v2_data(shape: list[int], datatype: str) -> st.SearchStrategy[Any]:
    count = 1
    for d in shape:
        count *= d
    if count > 64 or count < 0:
        return st.lists(json_leaf, max_size=4)
    leaf: st.SearchStrategy[Any]
    if datatype == "BYTES":
        leaf = text
    elif datatype == "BOOL":
        leaf = st.booleans()
    elif datatype.startswith("FP"):
        leaf = floats
    else:
        leaf = ints
    return st.lists(leaf, min_size=count, max_size=count)


@st.composite
def v2_input(draw: st.DrawFn, binary: bool) -> tuple[dict[str, Any], bytes]:
    datatype = draw(hostile(st.sampled_from(DATATYPES)))
    shape = draw(hostile(shapes))
    doc: dict[str, Any] = {"name": draw(hostile(st.sampled_from(["x", "y", "z", "__parameters__"]))),
                           "datatype": datatype, "shape": shape}  # fmt: skip
    blob = b""
    if binary and draw(st.booleans()):
        blob = draw(v2_blob(datatype, shape))
        size: Any = len(blob)
        if draw(st.integers(0, 4)) == 0:
            size = draw(hostile(ints))
        doc["parameters"] = {"binary_data_size": size}
    elif isinstance(shape, list) and all(isinstance(d, int) for d in shape):
        doc["data"] = draw(hostile(_v2_data(shape, datatype if isinstance(datatype, str) else "")))
    else:
        doc["data"] = draw(json_value)
    if draw(st.integers(0, 6)) == 0:
        doc["parameters"] = draw(hostile(optional_fields(shared_memory_region=text)))
    return doc, blob


@st.composite
def v2_blob(draw: st.DrawFn, datatype: Any, shape: Any) -> bytes:
    """A binary tensor: exactly sized, BYTES elements with (possibly lying) length
    prefixes, or noise."""
    if datatype == "BYTES":
        elements = draw(st.lists(st.binary(max_size=8), max_size=6))
        out = b""
        for e in elements:
            n = (
                len(e)
                if draw(st.integers(0, 5))
                else draw(st.sampled_from([0, 1, 2**31, 2**32 - 1]))
            )
            out += struct.pack("<I", n) + e
        return out
    count = 1
    if isinstance(shape, list):
        for d in shape:
            count *= d if isinstance(d, int) else 1
    width = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
             "UINT32": 4, "INT32": 4, "FP32": 4}.get(datatype if isinstance(datatype, str) else "", 8)  # fmt: skip
    if 0 <= count <= 64 and draw(st.booleans()):
        return draw(st.binary(min_size=count * width, max_size=count * width))
    return draw(st.binary(max_size=64))


_WIDTHS = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
           "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}  # fmt: skip
_INT_RANGES = {"UINT8": (0, 2**8 - 1), "INT8": (-(2**7), 2**7 - 1),
               "UINT16": (0, 2**16 - 1), "INT16": (-(2**15), 2**15 - 1),
               "UINT32": (0, 2**32 - 1), "INT32": (-(2**31), 2**31 - 1),
               "UINT64": (0, 2**64 - 1), "INT64": (-(2**63), 2**63 - 1)}  # fmt: skip


@st.composite
def v2_valid_input(draw: st.DrawFn, index: int, binary: bool) -> tuple[dict[str, Any], bytes]:
    """A well-formed V2 input (JSON data, or binary with its exact ``binary_data_size``
    and BYTES framing), so a body reaches the model and the response encoder."""
    datatype = draw(st.sampled_from([*_WIDTHS, "BYTES"]))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = 1
    for d in shape:
        count *= d
    doc: dict[str, Any] = {"name": f"x{index}", "datatype": datatype, "shape": shape}
    if binary and draw(st.booleans()):
        if datatype == "BYTES":
            items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
            blob = b"".join(struct.pack("<I", len(e)) + e for e in items)
        else:
            n = count * _WIDTHS[datatype]
            blob = draw(st.binary(min_size=n, max_size=n))
        doc["parameters"] = {"binary_data_size": len(blob)}
        return doc, blob
    leaf: st.SearchStrategy[Any]
    if datatype == "BYTES":
        leaf = text
    elif datatype == "BOOL":
        leaf = st.booleans()
    elif datatype.startswith("FP"):
        leaf = st.floats(-1e4, 1e4)
    else:
        leaf = st.integers(*_INT_RANGES[datatype])
    doc["data"] = draw(st.lists(leaf, min_size=count, max_size=count))
    return doc, b""


def _v2_valid_extra(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    output = st.fixed_dictionaries(
        {"name": st.sampled_from(names)},
        optional={"parameters": optional_fields(binary_data=st.booleans())},
    )
    return optional_fields(
        id=text,
        parameters=optional_fields(binary_data_output=st.booleans()),
        outputs=st.lists(output, max_size=2, unique_by=lambda o: o["name"]),
    )


@st.composite
def _v2_valid(draw: st.DrawFn, binary: bool) -> tuple[dict[str, Any], bytes]:
    pairs = [draw(v2_valid_input(i, binary)) for i in range(draw(st.integers(1, 3)))]
    doc: dict[str, Any] = {"inputs": [p[0] for p in pairs]}
    doc.update(draw(_v2_valid_extra([p[0]["name"] for p in pairs])))
    return doc, b"".join(p[1] for p in pairs)


@st.composite
def v2_json_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(documents(st.fixed_dictionaries({}, optional={"inputs": json_value})))
    if kind <= 2:  # near-valid: reaches the model and the response encoder
        return json.dumps(draw(_v2_valid(binary=False))[0]).encode()
    inputs = [draw(v2_input(binary=False))[0] for _ in range(draw(st.integers(0, 3)))]
    doc: dict[str, Any] = {"inputs": inputs}
    doc.update(draw(_v2_extra()))
    return draw(documents(st.just(doc)))


def _v2_extra() -> st.SearchStrategy[dict[str, Any]]:
    output = optional_fields(
        name=hostile(st.sampled_from(["x", "y", "__parameters__"])),
        parameters=hostile(
            optional_fields(
                binary_data=hostile(st.booleans()),
                classification=hostile(small_ints),
                shared_memory_region=text,
            )
        ),
    )
    return optional_fields(
        id=hostile(text), parameters=hostile(_params), outputs=hostile(st.lists(output, max_size=3))
    )


@st.composite
def v2_binary_bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    """A binary-extension body and its Inference-Header-Content-Length header value."""
    if draw(st.integers(0, 2)) == 0:  # well-formed: the binary path to the model and back
        valid, data = draw(_v2_valid(binary=True))
        head = json.dumps(valid).encode()
        return head + data, str(len(head))
    pairs = [draw(v2_input(binary=True)) for _ in range(draw(st.integers(0, 3)))]
    doc: dict[str, Any] = {"inputs": [p[0] for p in pairs]}
    doc.update(draw(_v2_extra()))
    header = json.dumps(doc).encode()
    if draw(st.integers(0, 6)) == 0:
        header = draw(documents(st.just(doc)))
    blob = b"".join(p[1] for p in pairs)
    if draw(st.integers(0, 6)) == 0:
        blob += draw(st.binary(max_size=16))
    length: str = str(len(header))
    kind = draw(st.integers(0, 8))
    if kind == 0:
        length = str(draw(st.integers(-5, len(header) + len(blob) + 5)))
    elif kind == 1:
        length = draw(st.sampled_from(["", "+1", "0x10", "1e3", "99999999999999999999", "-0", "٣"]))
    return header + blob, length


# -- raw ------------------------------------------------------------------------------------
_query_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="#"),
    max_size=24,
)
_query_value = st.one_of(
    _query_text,
    st.sampled_from(["1", "0", "true", "yes", "block", "coalesce", "nan", "inf", "-1", "1e400"]),
    ints.map(str),
    floats.map(str),
)


@st.composite
def raw_queries(draw: st.DrawFn) -> str:
    keys = st.sampled_from(["stream", "max_tokens", "policy", "timeout", "x", ""])
    pairs = draw(st.lists(st.tuples(st.one_of(keys, _query_text), _query_value), max_size=5))
    query = "&".join(f"{k}={v}" for k, v in pairs)
    if draw(st.integers(0, 5)) == 0:
        query = draw(_query_text)
    return query
