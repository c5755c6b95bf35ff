"""Batches as the cost model prices them: (new tokens, context) per request segment.

What a batch's shape decides: tokens, the (query, key) pairs attention computes (causal, sliding
window or chunked), the cached keys it reads, and the KV-cache tokens a layer keeps.
"""

from __future__ import annotations

from tpplan.cost.workload import PrefillBatch
from tpplan.lower.batch import Segments, batch_pairs, masked_pairs


def cached_tokens(attn: object, seqs: list[int]) -> int:
    """Tokens of KV cache one attention layer keeps for sequences of these lengths: all of them, or
    at most the sliding window / the attention chunk (engines free blocks that fall out of it)."""
    limit = getattr(attn, "window", None) or getattr(attn, "chunk", None)
    return sum(min(s, limit) if limit else s for s in seqs)


def segments_of(batch: PrefillBatch) -> Segments:
    """A scheduled prefill batch's segments."""
    return tuple((s.n_tokens, s.start_pos) for s in batch.segments)


__all__ = ["Segments", "batch_pairs", "cached_tokens", "masked_pairs", "segments_of"]
