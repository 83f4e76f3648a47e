"""HTTP endpoints, one module per API: ops (health, readiness, metrics), raw, OpenAI, KServe V2."""
