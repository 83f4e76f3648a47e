"""Golden greedy output of the default generative model through the OpenAI API.

The pinned texts belong to one set of weights (keyed by the SHA-256 of the shipped
``weights.safetensors``). Retraining the model (``make model``) changes them: the pinned
check then skips and prints the new texts to pin here, while the invariants (the same
answer on every run, streamed or not, and equal to the model run directly) still run.
"""

from __future__ import annotations

import hashlib

import openai
import pytest

from zeroserve.models.base import GenerateRequest
from zeroserve.models.tinyllm import MODEL_DIR, TinyLlamaModel

MAX_TOKENS = 32
PROMPTS = {
    "chat:str.split": [{"role": "user", "content": "str.split"}],
    "chat:for": [{"role": "user", "content": "for"}],
}
GOLDEN: dict[str, dict[str, str]] = {
    # tinyllm as shipped in 38c1110 (val 1.786 bits/char)
    "817e25fc66aac1bee0dd383e3c477788fbc645ad1302c3dbe6745f4e431e82c1": {
        "chat:str.split": (
            "Return a list of the current line number of the same as\n\n"
            'The "sys.g.g.g.  The space is a s'
        ),
        "chat:for": (
            "Return a list of the current line of the current line.\n\n"
            "The argument is a string, or a string, or a string.\n\nThe argument"
        ),
    },
}


def weights_sha256() -> str:
    return hashlib.sha256((MODEL_DIR / "weights.safetensors").read_bytes()).hexdigest()


def answers(client: openai.OpenAI, stream: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, messages in PROMPTS.items():
        kw = dict(model="tinyllm", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        if stream:
            chunks = client.chat.completions.create(stream=True, **kw)  # type: ignore[call-overload]
            out[key] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
            out[key] = r.choices[0].message.content or ""
    return out


def test_greedy_output_is_stable_and_pinned(client: openai.OpenAI) -> None:
    first = answers(client, stream=False)
    assert answers(client, stream=False) == first
    assert answers(client, stream=True) == first
    model = TinyLlamaModel()
    model.load()
    for key, messages in PROMPTS.items():
        req = GenerateRequest(
            prompt=model.chat_template(messages), max_tokens=MAX_TOKENS, temperature=0.0
        )
        assert "".join(model.generate(req)) == first[key]
    pinned = GOLDEN.get(weights_sha256())
    if pinned is None:
        pytest.skip(f"new weights {weights_sha256()}: pin {first!r} in GOLDEN")
    assert first == pinned
