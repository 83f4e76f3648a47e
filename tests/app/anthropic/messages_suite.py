"""What the Messages API suite shares besides its fixtures: SDK clients and constants."""

from __future__ import annotations

import anthropic

KEY = "anthropic-suite-key"
# The ``keyed`` server's body limit (a 413 in Anthropic's shape past it).
SMALL_BODY_BYTES = 4096


def client(url: str, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0)


def async_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
