"""The bench's windowed, chunked and sink attention (issue 34) equal the runtime's masked reference, and the
reference's scores in query blocks equal the one-shot reference (DSA's indexer too)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tpplan.bench import gpu_kernels as GK  # noqa: E402
from tpplan.bench import masked_attention as MA  # noqa: E402
from tpplan.runtime import fast_kernels as RF  # noqa: E402
from tpplan.runtime import kernels_attention as KA  # noqa: E402

SHAPES = [
    (37, 37, 8),
    (20, 53, 16),
    (40, 40, 12),
    (5, 90, 3),
    (64, 64, 2),
    (30, 40, 9),
]  # (queries, keys, window): first chunk, cached keys


def _qkv(t: int, s: int, seed: int, dv: int = 16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, 3, 16, generator=g), torch.randn(s, 3, 16, generator=g), torch.randn(s, 3, dv, generator=g)


def _close(a, b) -> bool:
    return float((a - b).norm() / b.norm()) < 1e-5


@pytest.mark.parametrize(("t", "s", "w"), SHAPES)
@pytest.mark.parametrize("with_sinks", [False, True])
def test_windowed_attention_is_the_masked_reference(t: int, s: int, w: int, with_sinks: bool) -> None:
    q, k, v = _qkv(t, s, t + s + w)
    sinks = torch.randn(3) if with_sinks else None
    ref = KA.causal_attention(q, k, v, 0.25, window=w, sinks=sinks)
    assert not _close(KA.causal_attention(q, k, v, 0.25, sinks=sinks), ref)  # the window changes the result
    assert _close(MA.windowed_attention(q, k, v, 0.25, w, sinks), ref)
    for block in (4, 8, None):
        assert _close(MA.banded_attention(q, k, v, 0.25, w, sinks, block=block), ref)


@pytest.mark.parametrize(("t", "s", "w"), SHAPES)
def test_sink_and_chunked_attention_are_the_reference(t: int, s: int, w: int) -> None:
    q, k, v = _qkv(t, s, 3 * t + s)
    sinks = torch.randn(3) * 2
    ref = KA.causal_attention(q, k, v, 0.25, sinks=sinks)
    assert not _close(KA.causal_attention(q, k, v, 0.25), ref)
    assert _close(MA.sink_attention(q, k, v, 0.25, sinks), ref)
    chunk = max(2, w)
    want = KA.causal_attention(q, k, v, 0.25, chunk=chunk)
    assert _close(MA.chunked_attention(q, k, v, 0.25, chunk, RF.causal_attention), want)


def test_the_windowed_kernel_reads_only_the_window() -> None:
    """Keys outside every query's window can hold anything (here NaN): the output does not see them."""
    q, k, v = _qkv(16, 64, 7)
    for w in (4, 7):  # the first query (position 48) reads 49 - w .. 48
        k2, v2 = k.clone(), v.clone()
        k2[: 49 - w], v2[: 49 - w] = float("nan"), float("nan")
        ref = MA.windowed_attention(q, k, v, 0.25, w)
        assert torch.equal(MA.windowed_attention(q, k2, v2, 0.25, w), ref)
    k2, v2 = k.clone(), v.clone()
    k2[:45], v2[:45] = float("nan"), float("nan")
    ref = MA.banded_attention(q, k, v, 0.25, 4, block=8)
    assert torch.equal(MA.banded_attention(q, k2, v2, 0.25, 4, block=8), ref)


def test_reference_scores_in_query_blocks_equal_the_one_shot_reference(monkeypatch) -> None:
    q, k, v = _qkv(13, 29, 11, dv=8)
    keep = torch.rand(13, 29, generator=torch.Generator().manual_seed(1)) > 0.3
    kw = {"window": 9, "sinks": torch.randn(3)}
    whole = KA.causal_attention(q, k, v, 0.3, keep, **kw)
    assert KA.query_block(13, 3 * 29) == 13
    monkeypatch.setattr(KA, "SCORE_BUDGET", 3 * 29 * 4)  # four queries at a time
    assert KA.query_block(13, 3 * 29, KA.SCORE_BUDGET) == 4
    monkeypatch.setattr(KA, "query_block", lambda t, per, budget=0: 4)
    assert torch.allclose(KA.causal_attention(q, k, v, 0.3, keep, **kw), whole, atol=1e-6)


def test_indexer_in_query_blocks_selects_what_the_one_shot_indexer_selects(monkeypatch) -> None:
    from tpplan.runtime.kernels_local import Rope

    g = torch.Generator().manual_seed(3)
    t, heads, d = 11, 4, 16
    args = (torch.randn(t, heads * d, generator=g), torch.randn(t, d, generator=g), torch.randn(t, heads, generator=g))
    kw = {"head_dim": d, "rope_dim": 8, "positions": torch.arange(t), "rope": Rope(theta=10000.0),
          "topk": 5, "k_norm_weight": torch.ones(d), "k_norm_bias": torch.zeros(d)}  # fmt: skip
    whole = KA.dsa_indexer(*args, **kw)
    monkeypatch.setattr(KA, "query_block", lambda t, per, budget=0: 3)
    assert torch.equal(KA.dsa_indexer(*args, **kw), whole)


KV_HEADS_SEEN: list[int] = []
_REFERENCE = KA.causal_attention  # the runtime's, also while `installed` swaps kernels_attention's


def _fla_contract(q, k, v, *, scale, window_size, sink_bias):
    """fla's `parallel_attn` contract on [1, T, H, D] (q and k of one length, the window relative to it,
    sinks in the denominator), by the runtime's reference: stands in for the GPU kernel on the CPU."""
    assert q.shape[1] == k.shape[1] == v.shape[1], "fla's kernel takes q and k of one length"
    KV_HEADS_SEEN.append(k.shape[2])
    kk, vv = KA.repeat_kv(k[0], v[0], q.shape[2])  # GQA: HQ query heads over H kv heads
    out = _REFERENCE(q[0], kk, vv, scale, window=window_size, sinks=sink_bias)
    return out.reshape(1, q.shape[1], q.shape[2], -1)


@pytest.mark.parametrize(("t", "s", "w"), SHAPES)
@pytest.mark.parametrize("with_sinks", [False, True])
def test_fla_window_after_a_cache_is_the_masked_reference(t: int, s: int, w: int, with_sinks: bool) -> None:
    """The cut keys and front-padded queries around fla's equal-length kernel give the reference's result,
    and keys before the first query's window are never read (NaN there changes nothing)."""
    q, k, v = _qkv(t, s, 2 * t + s + w)
    sinks = torch.randn(3) if with_sinks else None
    ref = KA.causal_attention(q, k, v, 0.25, window=w, sinks=sinks)
    got = MA.fla_window_attention(q, k, v, 0.25, w, sinks, attn=_fla_contract)
    assert got.shape == ref.shape and _close(got, ref)
    first = max(0, s - t - w + 1)
    k2, v2 = k.clone(), v.clone()
    k2[:first], v2[:first] = float("nan"), float("nan")
    assert torch.equal(MA.fla_window_attention(q, k2, v2, 0.25, w, sinks, attn=_fla_contract), got)


def test_fla_window_runs_wide_values_in_slices_of_v_tile(monkeypatch) -> None:
    """Values wider than V_TILE (Gemma 3's 256 on an H100: fla's one-tile config is out of shared memory) go
    to the kernel in V_TILE-wide slices whose outputs, side by side, are the reference's."""
    widths: list[int] = []

    def contract(q, k, v, **kw):
        widths.append(v.shape[-1])
        return _fla_contract(q, k, v, **kw)

    monkeypatch.setattr(MA, "V_TILE", 8)
    q, k, v = _qkv(20, 53, 9, dv=20)
    sinks = torch.randn(3)
    got = MA.fla_window_attention(q, k, v, 0.25, 16, sinks, attn=contract)
    assert widths == [8, 8, 4] and _close(got, KA.causal_attention(q, k, v, 0.25, window=16, sinks=sinks))


def test_the_window_takes_the_band_kernel_off_cuda() -> None:
    from tpplan.bench import serving_kernels as SK

    q, k, v = _qkv(20, 53, 4)
    assert not GK.fla_window(q, v)
    name, out = SK.serving_attention(q, k, v, 0.25, 16, None, None)
    assert name == SK.WINDOWED and _close(out, KA.causal_attention(q, k, v, 0.25, window=16))


def test_the_indexer_takes_the_reference_off_cuda() -> None:
    from tpplan.runtime.kernels_local import Rope

    g = torch.Generator().manual_seed(4)
    t, heads, d = 9, 2, 16
    args = (torch.randn(t, heads * d, generator=g), torch.randn(t, d, generator=g), torch.randn(t, heads, generator=g))
    kw = {"head_dim": d, "rope_dim": 8, "positions": torch.arange(t), "rope": Rope(theta=1e4), "topk": 4,
          "k_norm_weight": torch.ones(d), "k_norm_bias": torch.zeros(d)}  # fmt: skip
    assert not GK.fused_indexer_ok(args[0], d)
    name, got = GK.serving_indexer(*args, **kw)
    assert name == GK.REFERENCE_INDEXER and torch.equal(got, KA.dsa_indexer(*args, **kw))


def test_a_kernel_that_raises_falls_back_for_its_shape(monkeypatch) -> None:
    """fla's window raising (e.g. out of shared memory) gives the band kernel; the fused indexer raising after
    it appended its keys gives the reference with the cache as it was; both are recorded and kept."""
    from tpplan.bench import serving_kernels as SK
    from tpplan.runtime.kernels_local import Rope

    def boom(*a, **kw):
        if "cache" in kw:
            KA.append_cache(kw["cache"], "k", torch.zeros(3, 16))
        raise RuntimeError("out of resources")

    monkeypatch.setattr(GK, "_REFUSED", {})
    monkeypatch.setattr(MA, "fla_parallel_attn", lambda: boom)
    monkeypatch.setattr(MA, "fla_window_attention", boom)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q, k, v = _qkv(20, 53, 4)
    assert GK.fla_window(q, v)
    name, out = SK.serving_attention(q, k, v, 0.25, 16, None, None)
    assert name == SK.WINDOWED and not GK.fla_window(q, v)
    assert _close(out, KA.causal_attention(q, k, v, 0.25, window=16))
    monkeypatch.setattr(GK, "_fused_indexer", lambda: boom)
    g = torch.Generator().manual_seed(4)
    args = (torch.randn(3, 2 * 16, generator=g), torch.randn(3, 16, generator=g), torch.randn(3, 2, generator=g))
    kw = {"head_dim": 16, "rope_dim": 8, "positions": torch.arange(5, 8), "rope": Rope(theta=1e4), "topk": 4,
          "k_norm_weight": torch.ones(16), "k_norm_bias": torch.zeros(16)}  # fmt: skip
    prior = torch.randn(5, 16, generator=g)
    cache = {"k": prior}
    name, got = GK.serving_indexer(*args, **kw, cache=cache)
    assert name == GK.REFERENCE_INDEXER and cache["k"].shape[0] == 8 and torch.equal(cache["k"][:5], prior)
    assert sorted(GK.kernel_refusals()) == ["fla window, head dim 16", "fused indexer, 2 heads"]
    monkeypatch.undo()
    assert torch.equal(got, KA.dsa_indexer(*args, **kw, cache={"k": prior}))


def test_installed_gqa_hands_fla_the_kv_heads_unrepeated(monkeypatch) -> None:
    """Under `installed`, a windowed GQA layer reaches fla's kernel with its KV heads once each (GQA in the
    kernel, as engines run it) and gives the runtime's result; elsewhere the heads are repeated as before."""
    from tpplan.bench import serving_kernels as SK
    from tpplan.runtime import kernels as K
    from tpplan.runtime.kernels_local import Rope

    g = torch.Generator().manual_seed(6)
    t, d = 24, 16
    q, k, v = torch.randn(t, 6 * d, generator=g), torch.randn(t, 2 * d, generator=g), torch.randn(t, 2 * d, generator=g)
    kw = {"head_dim": d, "positions": torch.arange(t), "rope": Rope(theta=1e4), "rotary_dim": 8, "window": 5,
          "sinks": torch.randn(6, generator=g)}  # fmt: skip
    want = KA.gqa_attention(q, k, v, **kw)
    with SK.installed():
        band = K.gqa_attention(q, k, v, **kw)
        assert SK.attention_variants_used() == [SK.WINDOWED + " + " + SK.SINKS]
    monkeypatch.setattr(GK, "fla_window", lambda q, v: True)
    monkeypatch.setattr(MA, "fla_parallel_attn", lambda: _fla_contract)
    KV_HEADS_SEEN.clear()
    with SK.installed():
        fla = K.gqa_attention(q, k, v, **kw)
        assert SK.attention_variants_used() == [GK.FLA_WINDOW + " + " + GK.FLA_SINKS]
    assert GK.kernel_refusals() == {}, GK.kernel_refusals()
    assert KV_HEADS_SEEN == [2] and _close(fla, want) and _close(band, want)
