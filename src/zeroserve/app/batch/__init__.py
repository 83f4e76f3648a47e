"""OpenAI's Files and Batch APIs, durable under ``--data-dir`` (docs/architecture.md,
"The Batch API"): the routes (``routes``), the SQLite store and the files on disk
(``store``), the multipart upload (``upload``) and the runner that runs each line through
the same handler as its HTTP route, at the lowest priority (``runner``)."""

from .options import BATCH_PRIORITY, BatchOptions
from .routes import BatchApi

__all__ = ["BATCH_PRIORITY", "BatchApi", "BatchOptions"]
