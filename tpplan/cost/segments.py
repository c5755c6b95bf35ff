"""Batches as the cost model prices them: (new tokens, context) per request segment.

What a batch's shape decides: tokens, the (query, key) pairs attention computes (causal, sliding
window or chunked), the cached keys it reads, and the KV-cache tokens a layer keeps.
"""

from __future__ import annotations

from tpplan.cost.workload import PrefillBatch

Segments = tuple[tuple[int, int], ...]  # (tokens, context) per request segment of a batch


def batch_pairs(segs: Segments) -> tuple[int, int, int]:
    """Tokens, causal (query, key) pairs and context tokens read, for a batch of segments."""
    t = sum(n for n, _ in segs)
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in segs)
    return t, pairs, sum(c for _, c in segs)


def masked_pairs(segs: Segments, window: int | None = None, chunk: int | None = None) -> tuple[int, int]:
    """(query, key) pairs and cached keys read for a batch of segments when a query at position p sees
    only keys (p - window, p] (sliding window, HF's convention) or only those of its own `chunk`
    (Llama 4's chunked attention: [p // chunk * chunk, p]). Without either: `batch_pairs`' causal count."""

    def seen(m: int) -> int:  # keys seen by the queries at positions 0 .. m-1, summed
        if window:
            return m * (m + 1) // 2 if m <= window else window * (window + 1) // 2 + (m - window) * window
        if chunk:
            q, r = divmod(m, chunk)
            return q * chunk * (chunk + 1) // 2 + r * (r + 1) // 2
        return m * (m + 1) // 2

    pairs = sum(seen(c + n) - seen(c) for n, c in segs)
    if window:
        read = sum(min(c, window - 1) for _, c in segs)
    elif chunk:
        read = sum(c % chunk for _, c in segs)
    else:
        read = sum(c for _, c in segs)
    return pairs, read


def cached_tokens(attn: object, seqs: list[int]) -> int:
    """Tokens of KV cache one attention layer keeps for sequences of these lengths: all of them, or
    at most the sliding window / the attention chunk (engines free blocks that fall out of it)."""
    limit = getattr(attn, "window", None) or getattr(attn, "chunk", None)
    return sum(min(s, limit) if limit else s for s in seqs)


def segments_of(batch: PrefillBatch) -> Segments:
    """A scheduled prefill batch's segments."""
    return tuple((s.n_tokens, s.start_pos) for s in batch.segments)


__all__ = ["Segments", "batch_pairs", "cached_tokens", "masked_pairs", "segments_of"]
