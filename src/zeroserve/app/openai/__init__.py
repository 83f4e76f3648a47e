"""The OpenAI-compatible API's parts: wire schemas, generations, SSE chunk streams.

The routes themselves are registered by ``app/endpoints/openai.py``.
"""
