"""The bench's fused DSA indexer (`bench.fused_indexer`): its Triton index scores equal the reference's, and
its top-k keeps keys scored as the reference's top-k.

Needs triton. CI installs none, so this module is skipped there; run it on a CPU through Triton's interpreter:
`pip install --target DIR triton==3.5.0`, then
`PYTHONPATH=.:DIR TRITON_INTERPRET=1 pytest tests/bench/test_fused_indexer.py`.
The interpreter's bf16 dot is wrong (bf16 is kept as raw 16-bit integers there), so these tests feed fp16, which
takes the same kernel; bf16 is checked on the GPU (docs/benchmarks/h100-2026-12-06d/gpu_check.py).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from tpplan.bench import fused_indexer as FI  # noqa: E402
from tpplan.runtime import kernels_attention as KA  # noqa: E402
from tpplan.runtime.kernels_local import Rope, rope_cos_sin  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _scores(q, k, w, first):
    """The reference's index scores in fp32 (`kernels_attention.dsa_indexer`'s sum), future keys -inf."""
    s = torch.einsum("th,ths->ts", w.float(), torch.relu(torch.einsum("thd,sd->ths", q.float(), k.float())))
    future = (
        torch.arange(k.shape[0], device=q.device)[None] > (first + torch.arange(q.shape[0], device=q.device))[:, None]
    )
    return s.masked_fill(future, float("-inf"))


def test_index_scores_are_the_reference_sum() -> None:
    """Over several key tiles (BS) and query blocks (BT), after 150 cached keys: scores, and which are -inf."""
    g = torch.Generator().manual_seed(0)
    t, s, h, d, first = FI.BT + 6, FI.BS + 92, 3, 32, 150
    q, k, w = torch.randn(t, h, d, generator=g), torch.randn(s, d, generator=g), torch.randn(t, h, generator=g)
    q, k, w = q.half().to(DEV), k.half().to(DEV), w.to(DEV)
    got, want = FI.index_scores(q, k, w, first + torch.arange(t, device=DEV)), _scores(q, k, w, first)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin) and not fin.all()
    assert float((got[fin] - want[fin]).norm() / want[fin].norm()) < 1e-5


def _case(t: int, ctx: int, heads: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    args = tuple(x.half().to(DEV) for x in (torch.randn(t, heads * d, generator=g), torch.randn(t, d, generator=g),
                                             torch.randn(t, heads, generator=g)))  # fmt: skip
    pos = torch.arange(ctx, ctx + t, device=DEV)
    norm = {"k_norm_weight": torch.ones(d, device=DEV), "k_norm_bias": torch.zeros(d, device=DEV)}
    kw = {"head_dim": d, "rope_dim": 8, "positions": pos, "rope": Rope(theta=1e4), "topk": 16, **norm}
    prior = torch.randn(ctx, d, generator=g).half().to(DEV)
    return args, kw, prior


def _kept_scores(idx, args, kw, keys):
    """The reference's fp32 scores of the keys each query kept, sorted (ties and bf16 swaps compare equal)."""
    cos, sin = rope_cos_sin(kw["positions"], kw["rope_dim"], kw["rope"])
    q = KA.indexer_query(args[0], kw["head_dim"], kw["rope_dim"], cos, sin, False).half()
    w = args[2].float() * (q.shape[1] ** -0.5 * kw["head_dim"] ** -0.5)
    s = _scores(q, keys.half(), w, int(kw["positions"][0]))
    return s.gather(1, idx).sort(dim=1, descending=True).values


@pytest.mark.parametrize(("t", "ctx"), [(40, 0), (70, 150), (5, 9)])
def test_fused_indexer_keeps_the_reference_top_k(t: int, ctx: int) -> None:
    """Same shape as the reference's result, and the kept keys' scores are the reference's top-k scores."""
    args, kw, prior = _case(t, ctx, 3, 32, t + ctx)
    ref_cache, cache = {"k": prior.float()}, {"k": prior.clone()}
    ref = KA.dsa_indexer(*args, **kw, cache=ref_cache if ctx else {})
    got = FI.fused_dsa_indexer(*args, **kw, cache=cache if ctx else {})
    assert got.shape == ref.shape == (t, min(16, t + ctx))
    cos, sin = rope_cos_sin(kw["positions"], 8, kw["rope"])
    new = KA.indexer_key(args[1], kw["k_norm_weight"], kw["k_norm_bias"], 8, cos, sin, False)
    keys = cache["k"] if ctx else new
    want, have = _kept_scores(ref, args, kw, keys), _kept_scores(got, args, kw, keys)
    assert torch.allclose(have, want, rtol=1e-3, atol=1e-3)
    if t + ctx > 16:  # some keys are left out: another query's selection scores differently
        assert not torch.allclose(_kept_scores(got.flip(0), args, kw, keys), want, rtol=1e-3, atol=1e-3)


def test_fused_indexer_in_query_blocks_selects_what_one_block_selects(monkeypatch) -> None:
    """The logits budget's query blocks (here 16 rows, each its own position offset) change nothing."""
    args, kw, prior = _case(70, 150, 2, 16, 5)
    whole = FI.fused_dsa_indexer(*args, **kw, cache={"k": prior.clone()})
    monkeypatch.setattr(KA, "query_block", lambda t, per, budget=0: 16)
    assert torch.equal(FI.fused_dsa_indexer(*args, **kw, cache={"k": prior.clone()}), whole)
