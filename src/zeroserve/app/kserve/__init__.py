"""KServe V2 / Open Inference Protocol: the routes (``routes``), the request and response
schemas (``schemas``) and the tensor codec for JSON and the binary tensor data extension
(``codec``)."""
