"""Serving hf_attn models: continuous batching on transformers' own machinery with a paged cache per head kind
(`batching.py`, `paged_cache.py`, `paged_attention.py`), and `transformers serve` (`server.py`)."""
