"""vLLM's and llama.cpp's extensions to the OpenAI API that clients rely on: token
counts (``/tokenize``, ``/detokenize``) and reranking (``/v1/rerank``)."""
