"""The OpenAI-compatible API: its routes (``routes``), wire schemas (``schemas``,
``responses_schemas``), the front ends that translate it to and from the one chat
request (``chat``, ``responses``, ``responses_events``), and its SSE chunk streams
(``chunks``, ``streaming``)."""
