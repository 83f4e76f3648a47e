"""``zeroserve serve`` as a user runs it: the default models answer the OpenAI SDK."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from tests.support import model_scaled, scaled

# The CLI prints its address once the models are loaded; past this it has failed.
START_TIMEOUT_S = scaled(60.0)
# The longest one answer may take: smollm2's runs on its niced decode, which a busy
# machine slows far more than the suite (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
ANSWER_TIMEOUT_S = model_scaled(60.0)


@pytest.fixture(scope="module")
def cli_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "zeroserve", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ZEROSERVE_LOG_LEVEL": "warning"},
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:  # ends if the process dies
            m = re.search(r"on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "zeroserve serve did not start"
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
@pytest.mark.niced
def test_default_models_over_the_cli(cli_url: str) -> None:
    with openai.OpenAI(
        base_url=cli_url + "/v1", api_key="unused", max_retries=0, timeout=ANSWER_TIMEOUT_S
    ) as c:
        assert {m.id for m in c.models.list()} == {"echo", "tinyllm", "minilm", "smollm2"}
        chunks = list(
            c.chat.completions.create(
                model="tinyllm",
                messages=[{"role": "user", "content": "str.split"}],
                max_tokens=8,
                stream=True,
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        answer = c.chat.completions.create(
            model="smollm2",
            messages=[
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            max_tokens=12,
            temperature=0,
        )
        assert "Paris" in (answer.choices[0].message.content or "")
        e = c.embeddings.create(model="minilm", input="hello")
        assert len(e.data[0].embedding) == 384
