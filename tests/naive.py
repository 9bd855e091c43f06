"""Independent references for the tests: attention written out position by position, no code from hf_attn."""

import math

import torch


def visible_keys(query: int, num_keys: int, is_causal: bool, attend_to_self: bool, local_window: int | None):
    """Key indices query `query` may see, from the papers' definitions written as plain conditions."""
    keys = []
    for key in range(num_keys):
        if is_causal and key > query:
            continue
        if key == query and not attend_to_self:
            continue
        if local_window is not None and abs(query - key) > local_window:
            continue
        keys.append(key)
    return keys


def naive_attention(q, k, v, is_causal, attend_to_self, local_window=None, key_mask=None, scale=None, sink_tokens=0):
    """Loops over batch, head and query; a query with no visible key outputs zeros (Paper B). With `sink_tokens` a
    local query also sees the first `sink_tokens` real keys of its row (attention sinks) where its mask allows.

    Returns the output (B, H, T, D) and the full weights (B, H, T, S).
    """
    batch, heads, num_queries, dim = q.shape
    num_keys = k.shape[2]
    scale = 1 / math.sqrt(dim) if scale is None else scale
    out = torch.zeros(batch, heads, num_queries, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(batch, heads, num_queries, num_keys, dtype=torch.float64)
    for b in range(batch):
        for i in range(num_queries):
            query = i + num_keys - num_queries
            keys = visible_keys(query, num_keys, is_causal, attend_to_self, local_window)
            if sink_tokens:
                real = [j for j in range(num_keys) if key_mask is None or key_mask[b, j]]
                allowed = visible_keys(query, num_keys, is_causal, attend_to_self, None)
                keys = sorted(set(keys) | {j for j in real[:sink_tokens] if j in allowed})
            if key_mask is not None:
                keys = [j for j in keys if key_mask[b, j]]
            if not keys:
                continue
            for h in range(heads):
                scores = torch.stack([q[b, h, i].double() @ k[b, h, j].double() for j in keys]) * scale
                w = torch.softmax(scores, dim=0)
                weights[b, h, i, keys] = w
                out[b, h, i] = sum(w[n] * v[b, h, j].double() for n, j in enumerate(keys))
    return out, weights
