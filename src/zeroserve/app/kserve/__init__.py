"""KServe V2 / Open Inference Protocol: request and response schemas (``schemas``) and the
tensor codec for JSON and the binary tensor data extension (``codec``). The routes are in
``app.endpoints.kserve``."""
