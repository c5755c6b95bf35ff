"""The bench's DSA sparse attention (`bench.sparse_attention`): the Triton kernel that gathers each query's
selected keys gives the reference's masked attention, reads no other key, and is what `installed` runs for
DSA's top-k (falling back to the reference, recorded, when it raises).

The kernel tests need triton. CI installs none, so they are skipped there; run them on a CPU through Triton's
interpreter: `pip install --target DIR triton==3.5.0`, then
`PYTHONPATH=.:DIR TRITON_INTERPRET=1 pytest tests/bench/test_sparse_attention.py`.
fp16, not bf16: the interpreter's bf16 dot is wrong (tests/bench/test_fused_indexer.py); bf16 is for the GPU
check (docs/benchmarks/h100-2026-12-06d/gpu_check.py).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

from tpplan.bench import gpu_kernels as GK  # noqa: E402
from tpplan.runtime import kernels_attention as KA  # noqa: E402

_MASK, _ATTENTION = KA.index_mask, KA.causal_attention  # the reference's, whatever `installed` swaps in later
DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or (DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs triton, and on a CPU TRITON_INTERPRET=1",
)


def _case(t: int, ctx: int, heads: int, kv_heads: int, d: int, dv: int, nk: int, seed: int):
    """Queries at positions ctx.. ctx+t-1 over ctx+t keys; each selects nk distinct keys, some after itself."""
    g = torch.Generator().manual_seed(seed)
    s = t + ctx
    q = torch.randn(t, heads, d, generator=g).half()
    k = torch.randn(s, kv_heads, d, generator=g).half()
    v = torch.randn(s, kv_heads, dv, generator=g).half()
    rows = [torch.randperm(s, generator=g) for _ in range(t)]
    # every query keeps itself, as DSA's top-k does (no row all masked); indices distinct, as top-k's are
    idx = torch.stack([torch.cat([r.new_tensor([ctx + i]), r[r != ctx + i]])[:nk] for i, r in enumerate(rows)])
    return q.to(DEV), k.to(DEV), v.to(DEV), idx.to(DEV)


def _reference(q, k, v, idx, scale):
    kr, vr = KA.repeat_kv(k, v, q.shape[1])
    return _ATTENTION(q.float(), kr.float(), vr.float(), scale, _MASK(idx, k.shape[0]))


@needs_triton
@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "dv"),
    [(20, 1, 48, 32), (3, 3, 48, 16), (4, 2, 32, 16)],
    ids=["latent-mqa", "per-head-mla", "gqa"],
)
def test_sparse_attention_is_the_reference_under_its_top_k(heads: int, kv_heads: int, d: int, dv: int) -> None:
    """The latent (MQA) form the engines run (one KV row per key, 20 heads: two head blocks), the runtime's
    per-head MLA layout and a GQA layout, after 40 cached keys, with 37 selected keys (two tiles and a part)."""
    from tpplan.bench import sparse_attention as SA

    q, k, v, idx = _case(6, 40, heads, kv_heads, d, dv, 37, seed=heads)
    got = SA.sparse_attention(q, k, v, idx, 0.2)
    want = _reference(q, k, v, idx, 0.2)
    assert got.shape == want.shape == (6, heads * dv)
    assert float((got.float() - want).abs().max()) < 2e-3 * float(want.abs().max())
    dense = KA.causal_attention(q.float(), *KA.repeat_kv(k.float(), v.float(), heads), 0.2)
    assert float((got.float() - dense).abs().max()) > 1e-2  # the selection matters at this shape


@needs_triton
def test_sparse_attention_reads_only_the_selected_keys() -> None:
    """Keys no query selected (and selected ones after a query) are NaN: the result stays finite and equal.
    The values of the latent form are a view of the key rows (MLA: the latent's first DV columns)."""
    from tpplan.bench import sparse_attention as SA

    q, k, _, idx = _case(5, 30, 16, 1, 48, 32, 9, seed=3)
    v = k[..., :32]
    want = SA.sparse_attention(q, k, v, idx, 0.3)
    unread = torch.ones(k.shape[0], dtype=torch.bool, device=DEV)
    unread[idx[idx <= 30 + torch.arange(5, device=DEV)[:, None]]] = False
    poisoned = k.clone()
    poisoned[unread] = float("nan")
    got = SA.sparse_attention(q, poisoned, poisoned[..., :32], idx, 0.3)
    assert unread.sum() > 0 and torch.isfinite(got).all() and torch.equal(got, want)
    assert float((want.float() - _reference(q, k, v, idx, 0.3)).abs().max()) < 2e-3


def test_head_dims_split_as_the_kernel_needs() -> None:
    pytest.importorskip("triton")
    from tpplan.bench import sparse_attention as SA

    assert [SA.split_head_dim(d) for d in (576, 192, 128, 48, 8, 100)] == [
        (512, 64), (128, 64), (128, 0), (32, 16), None, None
    ]  # fmt: skip


def test_installed_dsa_attention_gathers_and_falls_back_when_the_kernel_raises(monkeypatch) -> None:
    """Under `installed`, MLA with DSA's top-k runs the sparse kernel over the indices `index_mask` was given
    (a stand-in computing the reference here: no triton in CI), recorded by name; a kernel that raises leaves
    that shape to the reference from then on, in `kernel_refusals`."""
    from tpplan.bench import serving_kernels as SK
    from tpplan.runtime import kernels as K

    q, k, v, idx = _case(6, 0, 2, 2, 16, 16, 4, seed=9)
    q, k, v = q.float(), k.float(), v.float()
    seen: list[object] = []

    def stand_in(q, k, v, indices, scale):
        seen.append(indices)
        return _reference(q, k, v, indices, scale)

    monkeypatch.setattr(GK, "sparse_attention_ok", lambda q: True)
    monkeypatch.setattr(GK, "_sparse_kernel", lambda: stand_in)
    want = _reference(q, k, v, idx, 0.25)
    with SK.installed():
        got = K.causal_attention(q, k, v, 0.25, K.index_mask(idx, 6))
        assert SK.attention_variants_used() == [GK.SPARSE_ATTENTION] and seen == [idx]
        other = K.causal_attention(q, k, v, 0.25, _MASK(idx, 6))  # a mask `index_mask` did not build
        assert SK.attention_variants_used() == [SK.REFERENCE_FOR_TOPK, GK.SPARSE_ATTENTION]
    assert torch.equal(got, want) and torch.allclose(other, want)

    def raises(*a, **kw):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(GK, "_sparse_kernel", lambda: raises)
    monkeypatch.setattr(GK, "_REFUSED", {})
    with SK.installed():
        fell = K.causal_attention(q, k, v, 0.25, K.index_mask(idx, 6))
        assert SK.attention_variants_used() == [SK.REFERENCE_FOR_TOPK]
    assert torch.allclose(fell, want)
    assert list(GK.kernel_refusals()) == ["sparse attention, head dims 16/16, 2/2 heads"]


@needs_triton
def test_installed_mla_with_top_k_runs_the_kernel_on_the_runtimes_layout(monkeypatch) -> None:
    """The runtime's MLA call (per-head keys, the shared RoPE slice expanded, after a cache of earlier keys),
    under `installed` with the real kernel: the reference's result, and the kernel's name recorded."""
    from tpplan.bench import serving_kernels as SK
    from tpplan.runtime import kernels as K
    from tpplan.runtime.kernels_local import Rope

    g = torch.Generator().manual_seed(4)
    t, ctx, n, nope, rope, dv = 7, 25, 3, 32, 16, 16
    x = [torch.randn(ctx + t, w, generator=g).half().to(DEV) for w in (n * (nope + rope), n * (nope + dv), rope)]
    idx = _case(t, ctx, 1, 1, 16, 16, 11, seed=8)[3]
    kw = {"nope_dim": nope, "rope_dim": rope, "v_dim": dv, "rope": Rope(theta=1e4), "scale": 0.2}
    runs = []
    for installed in (False, True):
        monkeypatch.setattr(GK, "sparse_attention_ok", lambda q: True)
        cache: dict = {}
        with SK.installed(installed):
            KA.mla_attention(*(z[:ctx] for z in x), positions=torch.arange(ctx, device=DEV), cache=cache, **kw)
            keep = K.index_mask(idx, ctx + t)
            runs.append(K.mla_attention(*(z[ctx:] for z in x), positions=ctx + torch.arange(t, device=DEV),
                                        cache=cache, keep=keep, **kw))  # fmt: skip
            used = SK.attention_variants_used()
    assert used == ["causal", GK.SPARSE_ATTENTION], used
    assert float((runs[1].float() - runs[0].float()).abs().max()) < 2e-3 * float(runs[0].abs().max())
