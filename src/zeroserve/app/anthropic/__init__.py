"""Anthropic's Messages API (docs/architecture.md, "Anthropic's Messages API"): a front
end over every backend (``messages.py``), its stream's events (``events.py``), its
shapes (``schemas.py``) and its routes (``routes.py``)."""
