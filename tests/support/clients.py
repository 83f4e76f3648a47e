"""The ``openai`` SDK clients the suite talks to a server with: no retries (a test sees the
first answer, not a retried one), ``/v1`` under the server's address."""

from __future__ import annotations

from typing import Any

import openai


class OpenAIClients:
    """``client()`` and ``async_client()`` for a server that has a ``url``."""

    @property
    def url(self) -> str:
        raise NotImplementedError

    def client(self, api_key: str = "unused", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)

    def async_client(self, api_key: str = "unused", **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kw)
