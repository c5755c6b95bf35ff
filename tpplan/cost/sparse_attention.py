"""MLA attention in the absorbed MQA form, and DSA's prefill as each engine runs it (`engines.sparse_mla`).

The absorbed form scores each query's heads against cached latent rows (kv_lora + rope wide: 576 for
DeepSeek-V3.2) and sums kv_lora-wide values (512): 2 x (576 + 512) FLOPs per (query, head, key), where the
per-head form does 2 x (qk_head_dim + v_head_dim) = 2 x (192 + 128), 3.4 times fewer. Both engines run MLA
decode this way (`engines.scheduling.MLA_DECODE_ABSORBED`) and DSA's sparse prefill too, over each query's
selected keys (min(position + 1, top-k): the kernel is given the count). The runtime's sparse attention keeps
the per-head form: numerically the same attention, only its work differs (docs/cost-model.md).
"""

from __future__ import annotations

from tpplan.cost.segments import Segments
from tpplan.engines import select
from tpplan.engines.schema import SparseMLAPrefill
from tpplan.engines.sparse_mla import UNREAD_SPARSE, dense_prefill


def absorbed_mla_work(
    heads: int, queries: float, keys: float, rows: float, lora: int, rope: int, b: float
) -> tuple[float, float]:
    """(FLOPs, bytes) of absorbed MLA attention on one rank: `heads` query heads (as the kernel computes them)
    of `queries` queries over `keys` (query, key) pairs in all; `rows` latent rows read from memory (decode:
    one per pair, each request its own; a prefill step: each cached or new row once, its other gathers hit
    the L2), each query's 576-wide heads read and its 512-wide outputs written."""
    flops = 2.0 * heads * ((lora + rope) + lora) * keys
    nbytes = (rows * (lora + rope) + queries * heads * (2 * lora + rope)) * b
    return flops, nbytes


def _upto(m: int, topk: int) -> int:
    """Keys selected by the queries at positions 0..m-1: min(position + 1, top-k) each."""
    if m <= topk:
        return m * (m + 1) // 2
    return topk * (topk + 1) // 2 + (m - topk) * topk


def selected_keys(segs: Segments, topk: int) -> int:
    """(query, key) pairs DSA's top-k selection keeps over prefill segments (new tokens, cached tokens)."""
    return sum(_upto(c + n, topk) - _upto(c, topk) for n, c in segs)


def sparse_rule(engine: str) -> tuple[SparseMLAPrefill, str | None]:
    """The engine version's DSA prefill rule, and a note where it was not read (priced absorbed, unpadded)."""
    rule = select(engine).sparse_prefill
    if rule is None:
        return UNREAD_SPARSE, f"{engine}: its DSA prefill was not read; priced in the absorbed form, heads unpadded"
    return rule, None


def runs_absorbed(engine: str, segs: Segments, topk: int) -> bool:
    """Whether the engine runs a step's prefill segments (no one-token decodes) in the absorbed sparse form,
    not as dense per-head MHA (its rule on the step's longest sequence, cached and new tokens)."""
    if not segs:
        return False
    return not dense_prefill(sparse_rule(engine)[0], max(n + c for n, c in segs), topk)


__all__ = ["absorbed_mla_work", "runs_absorbed", "selected_keys", "sparse_rule"]
