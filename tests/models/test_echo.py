"""The built-in ``echo`` model's token count: exactly ``len(text.split())``, the count the
OpenAI routes report as ``prompt_tokens`` (its fast path works on the ASCII bytes)."""

from __future__ import annotations

import random

import pytest

from zeroserve.models.echo import EchoModel

MODEL = EchoModel()


@pytest.mark.parametrize("code", range(128))
def test_every_ascii_byte_splits_as_str_split_does(code: int) -> None:
    c = chr(code)
    for text in (c, f"a{c}b", f"{c}a", f"a{c}", f"{c}{c}a {c}b{c}", f"x\n{c}y"):
        assert MODEL.count_tokens(text) == len(text.split()), repr(text)


def test_random_texts_count_as_str_split_does() -> None:
    rng = random.Random(7)
    alphabet = "ab \t\n\r\x0b\x0c\x1c\x1f\x00\x08\x0e\x1b\x7f!"
    for size in (0, 1, 2, 3, 17, 1000, 65536):
        for _ in range(20):
            text = "".join(rng.choice(alphabet) for _ in range(size))
            assert MODEL.count_tokens(text) == len(text.split()), repr(text[:80])


def test_non_ascii_text_counts_as_str_split_does() -> None:
    # Unicode whitespace (NBSP, ideographic space, line separator) splits too.
    for text in ("héllo wörld", "a\u00a0b", "一\u3000二 三", "a\u2028b", "\u00a0"):
        assert MODEL.count_tokens(text) == len(text.split()), repr(text)
