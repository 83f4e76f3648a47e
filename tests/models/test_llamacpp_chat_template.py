"""A llama.cpp model's own chat template from a file (``chat_template_file=``, docs/llamacpp.md):
the engine renders chats, ``/tokenize`` and ``/v1/messages/count_tokens`` with it, tools
included. SmolLM2's GGUF template ignores tools, so this one, SmolLM2's ChatML plus the
tools and the calls, shows that the tools of a request reach the template: each tool's
name is rendered in a mark only this template writes (``[tool NAME]``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess, model_scaled, start_server
from tests.support.smollm2 import require_llamacpp, smollm2_arg

require_llamacpp()

# Its answers come from SmolLM2's niced threads (the side port's template and tokenizer, the
# decode): their bounds by model_scaled, pytest-timeout by model_slowdown
# (docs/decisions/0055-model-waits-scaled-for-the-niced-share.md).
pytestmark = pytest.mark.niced

# SmolLM2's ChatML, plus a system turn naming each tool and each call an assistant made.
TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call these functions:{% for tool in tools %} [tool {{ tool.function.name }}]{% endfor %}
<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}{% endif %}
{%- if message.tool_calls %}{% for call in message.tool_calls %}
[call {{ call.function.name }} {{ call.function.arguments | tojson }}]{% endfor %}{% endif %}
<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": PARAMETERS}
MARK = "[tool get_weather]"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def srv(template: Path) -> Iterator[ServerProcess]:
    server = start_server(
        "--model", "own=" + smollm2_arg(parallel=1, chat_template_file=template),
        "--model", "gguf=" + smollm2_arg(parallel=1),
    )  # fmt: skip
    yield server
    assert server.stop() == 0


def _post(srv: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=model_scaled(60))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _rendered(srv: ServerProcess, model: str, **extra: Any) -> tuple[int, str]:
    """The conversation's token count and its text back (the template's rendering)."""
    tokens = _post(srv, "/tokenize", {"model": model, "messages": MESSAGES, **extra})
    text = _post(srv, "/detokenize", {"model": model, "tokens": tokens["tokens"]})["prompt"]
    return tokens["count"], text


def test_tokenize_renders_the_tools_through_the_models_own_template(srv: ServerProcess) -> None:
    bare, bare_text = _rendered(srv, "own")
    count, text = _rendered(srv, "own", tools=[OPENAI_TOOL])
    assert count > bare
    assert MARK in text and "[tool" not in bare_text
    assert "What is the weather in Paris?" in text
    # The GGUF's own template (the same model without the file) writes no such mark.
    assert "[tool" not in _rendered(srv, "gguf", tools=[OPENAI_TOOL])[1]


def test_count_tokens_counts_the_tools_the_template_renders(srv: ServerProcess) -> None:
    """Anthropic's tools reach the same template: the count grows by what the OpenAI
    tool of the same name adds to /tokenize (this template renders only the name)."""

    def counted(**extra: Any) -> int:
        body = {"model": "own", "messages": MESSAGES, **extra}
        return int(_post(srv, "/v1/messages/count_tokens", body)["input_tokens"])

    bare, tooled = counted(), counted(tools=[ANTHROPIC_TOOL])
    assert tooled > bare
    assert tooled - bare == _rendered(srv, "own", tools=[OPENAI_TOOL])[0] - _rendered(srv, "own")[0]


def test_a_chat_runs_on_the_same_template(srv: ServerProcess) -> None:
    """The prompt a chat reports is the one /tokenize counts: the engine runs the file's
    template, not only counts with it."""
    chat = {"model": "own", "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    answer = _post(srv, "/v1/chat/completions", chat)
    assert answer["usage"]["prompt_tokens"] == _rendered(srv, "own")[0]


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "not found"), (b"", "empty"), (b"\xff\xfe{{ x }}", "not UTF-8")],
    ids=["missing", "empty", "binary"],
)
def test_a_bad_template_file_fails_the_start_naming_it(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "template.jinja"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(RuntimeError) as info:
        start_server("--model", "m=" + smollm2_arg(parallel=1, chat_template_file=path))
    assert str(path) in str(info.value) and reason in str(info.value)
