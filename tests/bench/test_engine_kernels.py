"""The engine-kernel loader and argument builders (`bench.engine_kernels`), on the CPU with stand-in ops.

The stand-ins assert what the interfaces expect (vLLM 0.34.0's `_vllm_fa3_C.fwd` argument list, FlashMLA's
sparse prefill and decode signatures) and, for FA3, compute its documented contract (varlen sequences,
bottom-right causal, window (left, right), s_aux in the denominator, GQA) so that the builder's output can be
compared with the runtime's reference attention.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tpplan.bench import engine_kernels as EK  # noqa: E402
from tpplan.bench import gpu_kernels as GK  # noqa: E402
from tpplan.runtime import fast_kernels as RF  # noqa: E402
from tpplan.runtime import kernels_attention as KA  # noqa: E402

_CACHED = (EK.fa3_ops, EK._flash_mla, EK._legacy_ops, RF.optional_callable)  # the loaders' once-per-process caches


@pytest.fixture(autouse=True)
def _fresh_loader(monkeypatch):
    """Each test loads from scratch (the loaders cache once per process) and leaves sys.path as it was."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for fn in _CACHED:
        fn.cache_clear()
    EK._REASONS.clear()
    EK._DECODE_STATE.clear()
    yield
    for fn in _CACHED:
        fn.cache_clear()
    EK._REASONS.clear()


def test_without_the_folder_nothing_loads_and_the_reason_is_recorded(monkeypatch) -> None:
    monkeypatch.delenv(EK.ENV, raising=False)
    assert EK.fa3_ops() is None and not EK.flashmla_loaded()
    refused = GK.kernel_refusals()
    assert "env TPPLAN_ENGINE_KERNELS is not set" in refused["engine FA3"]
    assert "env TPPLAN_ENGINE_KERNELS is not set" in refused["engine FlashMLA"]


def test_a_wrong_folder_is_refused_with_its_name(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(EK.ENV, str(tmp_path / "nowhere"))
    assert EK.fa3_ops() is None and not EK.flashmla_loaded()
    assert "nowhere is not a folder" in EK.refusals()["FA3"]
    monkeypatch.setenv(EK.ENV, str(tmp_path))  # a folder without the builds
    EK.fa3_ops.cache_clear()
    EK._flash_mla.cache_clear()
    assert EK.fa3_ops() is None and not EK.flashmla_loaded()
    assert "_vllm_fa3_C.abi3.so is missing" in EK.refusals()["FA3"]
    assert "is not an installed flash_mla package" in EK.refusals()["FlashMLA"]


def test_a_build_that_fails_to_load_is_refused_without_a_traceback(monkeypatch, tmp_path) -> None:
    """A corrupt .so (dlopen fails) and a flash_mla package whose import raises: both recorded, None returned."""
    so = tmp_path / EK.FA3_SO
    so.parent.mkdir(parents=True)
    so.write_bytes(b"not an ELF file")
    pkg = tmp_path / "flash_mla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('undefined symbol: aoti_torch_example')\n")
    monkeypatch.setenv(EK.ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert EK.fa3_ops() is None and EK.fa3_ops() is None  # once: the second call is the cached answer
    assert EK.refusals()["FA3"].startswith("load failed: OSError")
    assert EK._flash_mla("flash_mla_sparse_fwd") is None
    assert "undefined symbol: aoti_torch_example" in EK.refusals()["FlashMLA"]
    assert "its SM90 .so alone: FileNotFoundError" in EK.refusals()["FlashMLA"]  # no _C_legacy file either
    sys.modules.pop("flash_mla", None)


def test_on_a_machine_without_cuda_the_builds_are_not_loaded(monkeypatch, tmp_path) -> None:
    so = tmp_path / EK.FA3_SO
    so.parent.mkdir(parents=True)
    so.write_bytes(b"x")
    monkeypatch.setenv(EK.ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert EK.fa3_ops() is None and "no CUDA device" in EK.refusals()["FA3"]


def _fa3_contract(*a):
    """FA3's varlen forward by its documented contract (flash_attn_interface.py), checking the argument list."""
    assert len(a) == 37
    q, k, v, cu_q, cu_k, max_q, max_k = a[0], a[1], a[2], a[7], a[8], a[12], a[13]
    scale, causal, left, right, softcap, s_aux = a[23], a[24], a[25], a[26], a[27], a[33]
    assert a[3:7] == (None,) * 4 and a[9:12] == (None,) * 3 and a[14:23] == (None,) * 9
    assert causal is True and softcap == 0.0 and a[28] is True and a[29:33] == (None, 0, None, 0)
    assert a[34:] == (1, 0, None)
    assert cu_q.dtype == cu_k.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0]
    assert s_aux is None or (s_aux.dtype == torch.bfloat16 and s_aux.shape == (q.shape[1],) and q.shape[1] <= 64)
    assert (left, right) == (-1, -1) or right == 0
    group = q.shape[1] // k.shape[1]
    outs = []
    for i in range(len(cu_q) - 1):
        qi, ki, vi = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        sq, sk = qi.shape[0], ki.shape[0]
        assert sq <= max_q and sk <= max_k
        kr, vr = ki.repeat_interleave(group, 1), vi.repeat_interleave(group, 1)
        sc = torch.einsum("qhd,khd->hqk", qi.double(), kr.double()) * scale
        j, m = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        ok = m <= j + sk - sq
        if left >= 0:
            ok &= m >= j + sk - sq - left
        sc = sc.masked_fill(~ok, float("-inf"))
        if s_aux is not None:
            sc = torch.cat([sc, s_aux.double()[:, None, None].expand(-1, sq, 1)], dim=-1)
        p = torch.softmax(sc, dim=-1)[..., :sk]
        outs.append(torch.einsum("hqk,khd->qhd", p, vr.double()).to(q.dtype))
    return torch.cat(outs), None, None, None


@pytest.mark.parametrize(
    ("window", "chunk", "sinks", "ctx", "kv"),
    [(8, None, False, 0, 4), (8, None, True, 24, 2), (None, 16, False, 0, 4), (None, 16, False, 20, 1),
     (None, None, True, 12, 2)],
)  # fmt: skip
def test_fa3_arguments_express_windows_chunks_and_sinks(window, chunk, sinks, ctx, kv) -> None:
    """gpt-oss (window + sinks, GQA), Gemma (window), Llama 4 (chunks as varlen sequences) and sinks alone:
    FA3's contract over the built arguments equals the runtime's reference attention."""
    torch.manual_seed(0)
    t, h, d = 40, 4, 16
    q, k, v = torch.randn(t, h, d), torch.randn(t + ctx, kv, d), torch.randn(t + ctx, kv, d)
    snk = torch.randn(h).bfloat16().float() if sinks else None  # FA3 takes them in bf16: these are exact there
    got = EK.fa3_attention(q, k, v, d**-0.5, window, snk, chunk, op=_fa3_contract)
    want = KA.causal_attention(q, *KA.repeat_kv(k, v, h), d**-0.5, window=window, chunk=chunk, sinks=snk)
    assert got.shape == (t, h * d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_chunk_boundaries_start_at_the_first_chunk_a_query_reads() -> None:
    assert EK.chunk_seqlens(10, 50, 16) == ([0, 8, 10], [0, 16, 18], 32)  # keys 32-47 and 48-49
    assert EK.chunk_seqlens(5, 5, 16) == ([0, 5], [0, 5], 0)


def test_the_absorbed_form_has_the_shapes_flashmla_takes() -> None:
    q, k = torch.randn(6, 3, 192), torch.randn(9, 3, 192)
    idx = torch.randint(0, 9, (6, 4))
    qa, kv, ix = EK.absorbed_form(q, k, idx)
    assert qa.shape == (6, 3, 576) and kv.shape == (9, 1, 576) and ix.shape == (6, 1, 128)  # whole top-k blocks
    later = idx > torch.arange(3, 9)[:, None]  # queries at positions 3-8: a later key is no selection (-1)
    assert torch.equal(ix[:, 0, :4].long(), idx.masked_fill(later, -1)) and (ix[:, 0, 4:] == -1).all()
    assert qa.dtype == kv.dtype == torch.bfloat16 and ix.dtype == torch.int32
    assert torch.equal(qa[..., :192], q.bfloat16()) and not qa[..., 192:].any()  # zero-padded, not invented
    assert torch.equal(kv[:, 0, :192], k[:, 0].bfloat16())


def test_flashmla_sparse_pads_heads_to_64_and_calls_the_legacy_kernel() -> None:
    seen = {}

    def stand_in(q, kv, indices, sm_scale, d_v=512, use_legacy=False):
        seen.update(heads=q.shape[1], legacy=use_legacy, d_v=d_v, idx=indices.dtype, scale=sm_scale)
        assert q.is_contiguous() and kv.shape[1:] == (1, 576) and indices.dim() == 3
        rows = torch.arange(q.shape[1], dtype=torch.float32)[:, None]  # each head's rows hold its index
        return rows.expand(q.shape[0], q.shape[1], 512).clone(), None, None

    qa, kv, ix = EK.absorbed_form(torch.randn(5, 16, 192), torch.randn(7, 16, 192), torch.zeros(5, 4, dtype=torch.long))
    out = EK.flashmla_sparse(qa, kv, ix, 0.1, fn=stand_in)
    assert seen == {"heads": 64, "legacy": True, "d_v": 512, "idx": torch.int32, "scale": 0.1}
    assert out.shape == (5, 16, 512) and float(out[..., -1].max()) == 15.0  # the padded heads' rows dropped
    EK.flashmla_sparse(torch.zeros(2, 128, 576), kv[:2], ix[:2], 0.1, fn=stand_in)
    assert seen["heads"] == 128


def test_flashmla_decode_pages_the_latent_cache() -> None:
    seen = {}

    def meta():
        return "meta", None

    def stand_in(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits, **kw):
        seen.update(q=tuple(q.shape), cache=tuple(k_cache.shape), table=block_table.tolist(),
                    lens=cache_seqlens.tolist(), dv=head_dim_v, sched=sched, **kw)  # fmt: skip
        return torch.zeros(q.shape[0], 1, q.shape[2], 512), None

    lat = torch.randn(2, 128, 1, 576)
    assert torch.equal(EK.paged_latent(lat)[0][3], lat[1, 64:].reshape(64, 1, 576))  # request 1's second page
    out = EK.flashmla_decode(torch.randn(2, 16, 576), lat, 0.07, fns=(meta, stand_in))
    assert out.shape == (2, 16, 512)
    assert seen == {"q": (2, 1, 16, 576), "cache": (4, 64, 1, 576), "table": [[0, 1], [2, 3]], "lens": [128, 128],
                    "dv": 512, "sched": "meta", "softmax_scale": 0.07, "causal": True, "use_legacy": True}  # fmt: skip
    with pytest.raises(ValueError, match="not a multiple of 64"):
        EK.paged_latent(torch.randn(1, 100, 1, 576))


def test_off_cuda_the_bench_keeps_its_own_kernels(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(EK.ENV, str(tmp_path))
    q = torch.randn(4, 2, 16)
    assert GK.try_engine_attention(q, q, q, 0.25, 8, None, None) is None
    assert GK.try_engine_sparse(q, q, q, 0.25, torch.zeros(4, 2, dtype=torch.int32)) is None
    assert not GK.takes_gqa(q, q, None, 16, None)


def test_rank_fit_counts_flashmla_padded_heads_and_records_the_kernel() -> None:
    """The sparse family's work: FlashMLA computes 64 heads for 16 (its padding), the Triton kernel 16; the fitted
    set names the kernel the points recorded."""
    from tpplan.bench.rank_fit import fit_rank_sweep, sparse_work

    p = {"family": "sparse", "heads": 16, "topk": 8, "tokens": 10, "context": 0}
    assert sparse_work({**p, "variant": EK.FLASHMLA_SPARSE})[0] == 4 * sparse_work({**p, "variant": "triton"})[0]
    pts = [{**p, "heads": h, "tokens": t, "seconds": 1e-5 + 1e-9 * h * t, "variant": EK.FLASHMLA_SPARSE}
           for h in (64, 128) for t in (1024, 2048, 4096, 8192)]  # fmt: skip
    res = fit_rank_sweep(pts)
    assert res["constants"]["dsa_attention"]["impl"] == EK.FLASHMLA_SPARSE
    assert {r["model"] for r in res["points"]} == {"dsa_attention"}


def test_the_planners_dsa_attention_price_is_set_beside_each_sparse_point() -> None:
    """rank_fit's `priced_today` prices a sparse point as DeepSeek-V3.2's attention op at TP = 128 / heads."""
    from tpplan.bench.rank_fit import priced_today

    pts = [{"family": "sparse", "heads": h, "topk": 2048, "tokens": 4096, "context": 0, "seconds": 1e-3}
           for h in (128, 16)]  # fmt: skip
    rows = priced_today(pts)
    assert [r["model"] for r in rows] == ["dsa_attention"] * 2
    assert 0 < rows[1]["predicted_s"] < rows[0]["predicted_s"]  # TP8's rank has an eighth of the heads
    assert rows[0]["error"] == pytest.approx(rows[0]["predicted_s"] / 1e-3 - 1.0)


def test_the_bench_runs_fa3_first_and_falls_back_when_it_raises(monkeypatch) -> None:
    """Under `serving_attention` (the bench's window/chunk/sinks seam): FA3 where it may run, named; a shape it
    raises at is refused (recorded) and the bench's own kernel runs, for that shape from then on."""
    from tpplan.bench import serving_kernels as SK

    class Ops:
        fwd = staticmethod(_fa3_contract)

    monkeypatch.setattr(GK, "engine_attention_ok", lambda q: True)
    monkeypatch.setattr(EK, "fa3_ops", lambda: Ops)
    torch.manual_seed(1)
    q, k, v = torch.randn(24, 4, 16), torch.randn(40, 2, 16), torch.randn(40, 2, 16)
    sinks = torch.randn(4).bfloat16().float()
    want = KA.causal_attention(q, *KA.repeat_kv(k, v, 4), 0.25, window=8, sinks=sinks)
    name, got = SK.serving_attention(q, k, v, 0.25, 8, None, sinks)
    assert name == f"window: {EK.FA3} + sinks as s_aux" and GK.takes_gqa(q, v, 8, None, sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    def broken(*a):
        raise RuntimeError("We only support bf16 dtype for S aux.")

    Ops.fwd = staticmethod(broken)
    monkeypatch.setattr(GK, "_REFUSED", {})
    name, got = SK.serving_attention(q, k, v, 0.25, 8, None, sinks)
    assert EK.FA3 not in name and "S aux" in GK.kernel_refusals()["FA3, head dim 16/16"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert GK.try_engine_attention(q, k, v, 0.25, 8, None, sinks) is None  # refused at this shape from now on
    many = torch.randn(24, 72, 16)  # sinks with more than 64 query heads: FA3 would refuse, so it is not tried
    assert GK.try_engine_attention(many, k, v, 0.25, 8, None, torch.randn(72)) is None


def test_dsa_attention_in_the_bench_takes_flashmla_when_it_may(monkeypatch) -> None:
    """`try_sparse_attention` (the bench's DSA seam) runs FlashMLA's timing form first: the layer's shape, named."""
    seen = {}

    def stand_in(q, kv, indices, sm_scale, d_v=512, use_legacy=False):
        seen.update(q=tuple(q.shape), kv=tuple(kv.shape), idx=tuple(indices.shape))
        return torch.zeros(q.shape[0], q.shape[1], 512, dtype=q.dtype), None, None

    monkeypatch.setattr(GK, "engine_sparse_ok", lambda q: True)
    monkeypatch.setattr(EK, "_flash_mla", lambda name: stand_in)
    q, k, v = torch.randn(6, 16, 192), torch.randn(10, 16, 192), torch.randn(10, 16, 128)
    keep = GK.selected_keys(torch.randint(0, 4, (6, 3)), 10)
    name, out = GK.try_sparse_attention(q, k, v, 0.1, keep)
    assert name == GK.ENGINE_SPARSE and out.shape == (6, 16 * 128)
    assert seen == {"q": (6, 64, 576), "kv": (10, 1, 576), "idx": (6, 1, 128)}


def test_without_the_package_flashmlas_sm90_kernels_run_alone_as_its_interface_calls_them(
    monkeypatch, tmp_path
) -> None:
    """The package's import fails (e.g. its SM100 .so does not load) but `_C_legacy` does: the two kernels are
    called with the legacy arguments flash_mla_interface.py passes, the decode's scheduler state kept."""
    pkg = tmp_path / "flash_mla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('cuda.abi3.so: undefined symbol: aoti_torch_new')\n")
    calls = []

    class Ops:
        @staticmethod
        def sparse_prefill_fwd(*a):
            calls.append(("sparse", a[3:]))
            return "out", "max_logits", "lse"

        @staticmethod
        def dense_decode_fwd(*a):
            calls.append(("decode", a[2:]))
            return torch.zeros(2, 1, 16, 512), None, "meta", "splits"

    monkeypatch.setenv(EK.ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(EK, "_legacy_ops", lambda folder: Ops)
    assert EK.flashmla_loaded() and EK.refusals()["FlashMLA"].endswith(EK.LEGACY_ONLY)
    assert EK._flash_mla("flash_mla_sparse_fwd")("q", "kv", "idx", 0.5, d_v=512, use_legacy=True)[0] == "out"
    assert calls[0] == ("sparse", (0.5, 512, None, None, False, True))  # no sink, no topk_length, natural-log lse
    lat = torch.randn(2, 64, 1, 576)
    EK.flashmla_decode(torch.randn(2, 16, 576), lat, 0.07)
    EK.flashmla_decode(torch.randn(2, 16, 576), lat, 0.07)
    assert calls[1][1][0] == 512 and calls[1][1][3:] == (0.07, True, None, None)  # first call: no scheduler yet
    assert calls[2][1][5:] == ("meta", "splits")  # the next call at this shape reuses what the first one made
    assert EK.refusals()["FlashMLA"].count(EK.LEGACY_ONLY) == 1
    sys.modules.pop("flash_mla", None)
