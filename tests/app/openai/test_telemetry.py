"""The OpenAI layer's generation metrics (app/openai/telemetry.py): one timestamp per
delivery, exposed as Prometheus histograms."""

from __future__ import annotations

from zeroserve import metrics
from zeroserve.app.openai.telemetry import GenerationTimer


def _samples(model: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in metrics.exposition().decode().splitlines():
        if f'model="{model}"' in line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_pieces_delivered_together_count_as_gaps_of_zero() -> None:
    model = "telemetry-batches"
    timer = GenerationTimer(model)
    timer.tokens(3)  # the first delivery: the first token and two with it
    timer.token()
    timer.tokens(0)  # nothing delivered: nothing timed
    timer.tokens(2)
    assert timer.count == 6
    timer.observe(prompt_tokens=5)
    timer.observe()  # once only
    got = _samples(model)
    assert got[f'zeroserve_generation_ttft_seconds_count{{model="{model}"}}'] == 1
    # 6 tokens: 5 gaps, of which 3 are the tokens that arrived with the one before them.
    itl_count = f'zeroserve_generation_inter_token_seconds_count{{model="{model}"}}'
    assert got[itl_count] == 5
    zero_bucket = f'zeroserve_generation_inter_token_seconds_bucket{{le="0.0005",model="{model}"}}'
    assert got[zero_bucket] >= 3
    inf_bucket = f'zeroserve_generation_inter_token_seconds_bucket{{le="+Inf",model="{model}"}}'
    assert got[inf_bucket] == 5
    assert got[f'zeroserve_generation_tokens_total{{model="{model}"}}'] == 6
    assert got[f'zeroserve_generation_prompt_tokens_total{{model="{model}"}}'] == 5


def test_a_generation_without_tokens_observes_no_latency() -> None:
    model = "telemetry-empty"
    GenerationTimer(model).observe(tokens=0)
    assert not any("seconds" in name for name in _samples(model))
