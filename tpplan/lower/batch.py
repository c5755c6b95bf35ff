"""The batch a program is lowered for: (new tokens, context) per request segment, and the rank that runs it.

What a batch's shape decides: tokens, the (query, key) pairs attention computes (causal, sliding
window or chunked), the cached keys it reads. The cost model prices these segments; the runtime's
expected collectives are the same program lowered for one rank's real routing (`Batch.routes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpplan.layout.context_parallel import chunk_bounds, zigzag_chunks

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


def local_segments(segs: Segments, ranks: int, split: str) -> Segments:
    """The slowest CP rank's share of a batch dealt over `ranks` CP ranks, as the attention calls it
    makes: under zigzag, rank 0's two chunks of each request (chunk 0 after the request's context, chunk
    2c-1 after all but the last chunk; every rank computes the same causal pairs, SGLang's
    `kv_len_prev`/`kv_len_next` calls); under the contiguous split, the last rank's chunk after the
    first c-1 (the most keys)."""
    if ranks <= 1:
        return segs
    out: list[tuple[int, int]] = []
    for n, ctx in segs:
        if split == "zigzag":
            bounds = chunk_bounds(n, 2 * ranks)
            for i in zigzag_chunks(ranks, 0):
                start, stop = bounds[i]
                if stop > start:
                    out.append((stop - start, ctx + start))
        else:
            start, stop = chunk_bounds(n, ranks)[-1]
            out.append((stop - start, ctx + start))
    return tuple(out)


@dataclass(frozen=True)
class Batch:
    """What `lower` lowers for: the batch's segments, its activation dtype (a short name such as
    "bf16", or torch's, "float32"), the rank whose steps are listed (ranks differ only in the MoE
    all-to-all rows they send), and, where known, each MoE layer's routing (`routes[layer]`: every
    token's experts) so those rows are exact; without it the rows expected under uniform routing."""

    segments: Segments
    dtype: str = "bf16"
    rank: int = 0
    routes: Mapping[int, Sequence[Sequence[int]]] | None = field(default=None, compare=False, hash=False)

    @property
    def tokens(self) -> int:
        """New tokens in the batch."""
        return sum(n for n, _ in self.segments)


__all__ = ["Batch", "Segments", "batch_pairs", "local_segments", "masked_pairs"]
