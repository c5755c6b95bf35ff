"""`tpplan bench --kernels fast` for every family (issue 20, item 11): the serving kernels take every
argument the runtime passes (gpt-oss's biases and clamp, Llama 4's scaled inputs), a sliding window,
a chunk or sinks run kernels that skip the hidden keys (issue 34), top-k falls back to the reference,
and the results say which."""

from __future__ import annotations

import contextlib
import re

import pytest

torch = pytest.importorskip("torch")

from tpplan.bench import serving_kernels as FK  # noqa: E402
from tpplan.runtime import kernels as K  # noqa: E402


def _experts(seed: int, e: int = 6, w: int = 16, i: int = 8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, w, generator=g)
    r = K.route(x, torch.randn(e, w, generator=g), top_k=2, scoring="sigmoid")
    ws = [torch.randn(e, i, w, generator=g), torch.randn(e, i, w, generator=g), torch.randn(e, w, i, generator=g)]
    biases = {"gate_bias": torch.randn(e, i, generator=g), "up_bias": torch.randn(e, i, generator=g),
              "down_bias": torch.randn(e, w, generator=g)}  # fmt: skip
    return x, r, ws, biases


VARIANTS = {
    "gpt-oss": lambda b: {**b, "clamp": (1.702, 0.5)},  # a limit the random activations cross
    "llama4": lambda b: {"scale_inputs": True},
    "biases-only": lambda b: b,
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("path", ["sync-free", "nonzero", "expert-parallel", "per-expert-loop"])
def test_grouped_experts_take_every_runtime_keyword(variant: str, path: str) -> None:
    x, r, ws, biases = _experts(7)
    kw = VARIANTS[variant](biases)
    if path == "expert-parallel":  # a rank's column slice: tokens select 0, 1 or 2 of its experts
        r, ws, kw = (
            r[:, :3],
            [t[:3] for t in ws],
            {k: v[:3] if isinstance(v, torch.Tensor) else v for k, v in kw.items()},
        )
    ref = K.routed_experts(x, r, *ws, **kw)
    assert not torch.allclose(ref, K.routed_experts(x, r, *ws))  # the keywords change the result
    with FK.per_expert_loop() if path == "per-expert-loop" else contextlib.nullcontext():
        got = FK.grouped_routed_experts(x, r, *ws, **kw, top_k=2 if path == "sync-free" else None)
    assert torch.allclose(got, ref, atol=1e-5 * float(ref.abs().max()))


def test_masked_attention_is_the_reference_for_windows_and_chunks() -> None:
    g = torch.Generator().manual_seed(4)
    for t, s in ((7, 7), (4, 11)):  # a first chunk, and a chunk after cached keys
        q, k, v = (
            torch.randn(t, 3, 8, generator=g),
            torch.randn(s, 3, 8, generator=g),
            torch.randn(s, 3, 6, generator=g),
        )
        for masks in ({"window": 3}, {"chunk": 4}, {"window": 2, "chunk": 5}):
            ref = K.causal_attention(q, k, v, 0.3, **masks)
            assert not torch.allclose(ref, K.causal_attention(q, k, v, 0.3))
            assert torch.allclose(FK.masked_attention(q, k, v, 0.3, **masks), ref, atol=1e-5)


def test_installed_attention_records_which_variant_ran() -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(4, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    FK._ATTENTION.clear()
    with FK.installed():
        K.causal_attention(q, k, v, 0.3, window=3)
        assert FK.attention_variants_used() == [FK.WINDOWED]
        K.causal_attention(q, k, v, 0.3, sinks=torch.ones(2))
        K.causal_attention(q, k, v, 0.3, chunk=4)
        K.causal_attention(q, k, v, 0.3)
    assert FK.attention_variants_used() == sorted(["causal", FK.WINDOWED, FK.SINKS, FK.CHUNKED])
    FK._ATTENTION.clear()


def test_a_refused_grouped_shape_does_not_turn_the_loop_on_for_later_shapes(monkeypatch) -> None:
    """One shape torch._grouped_mm refuses runs the per-expert loop; the next shape tries the grouped GEMM
    again (last session: one refused gpt-oss slice put every later expert case on the loop)."""
    real = getattr(torch, "_grouped_mm", None)
    calls: list[int] = []

    def picky(a, b, offs=None):  # refuses an intermediate of 6, like _grouped_mm refuses 90
        calls.append(b.shape[-1])
        if 6 in (b.shape[-1], b.shape[-2]):
            raise RuntimeError("refused")
        if real is not None:
            return real(a, b, offs=offs)
        out, start = [], 0
        for e, end in enumerate(offs.tolist()):
            out.append(a[start:end] @ b[e])
            start = end
        return torch.cat(out)

    monkeypatch.setattr(torch, "_grouped_mm", picky, raising=False)
    FK.reset_expert_paths()
    x, r, _, _ = _experts(8)
    for inter in (6, 8):
        ws = [torch.randn(6, inter, 16), torch.randn(6, inter, 16), torch.randn(6, 16, inter)]
        want = K.routed_experts(x, r, *ws)
        assert torch.allclose(FK.grouped_routed_experts(x, r, *ws), want, atol=1e-4)
        assert FK.grouped_gemm_used()["cpu"] is (inter != 6)
        FK.reset_expert_paths()
    assert 8 in calls and any("6x6x16" in s for s in FK.refused_expert_shapes())


# --- one bench pass per family's tiny preset, in this process (one rank, gloo) --------------------


def _tiny_presets() -> list[str]:
    from tpplan.models.config import list_presets

    return [p for p in list_presets() if p.startswith("tiny-")]


@pytest.mark.parametrize("model", _tiny_presets())
def test_every_family_benches_with_the_fast_kernels(model: str, one_rank_group) -> None:
    """The whole bench pass of each tiny preset (`worker` on one gloo rank, then `build_results`),
    at the fewest tokens: every op timed, every op says which implementation ran."""
    from tpplan.bench.config import BenchConfig, check_inputs
    from tpplan.bench.results import build_results
    from tpplan.bench.worker import worker

    cfg = BenchConfig(model=model, plans=("baseline",), workload="seed-c8", tokens=4, chunk=4, requests=1,
                      iters=1, warmup=0, direct_iters=1, backend="gloo", nproc=1, progress=False)  # fmt: skip
    wl, _ = check_inputs(cfg, 1)
    threads = torch.get_num_threads()
    try:
        raw = worker(0, 1, torch.device("cpu"), (cfg, wl, "gloo"))
    finally:
        torch.set_num_threads(threads)
    (res,) = [b.results for b in build_results(cfg, wl, raw, 1, "gloo")]
    assert res.ops and all(o.measured_s > 0 and o.impl for o in res.ops)
    impls = {o.impl for o in res.ops}
    if "gpt-oss" in model:
        assert any("biases, clamped SwiGLU, down bias" in i for i in impls)
        assert any(FK.SINKS in i for i in impls) and any(FK.WINDOWED in i for i in impls)
    if "llama4" in model:
        assert any("routing-scaled inputs" in i for i in impls) and any(FK.CHUNKED in i for i in impls)
    if "gemma3" in model:
        assert any(FK.WINDOWED in i for i in impls)
    if re.search("deepseek-v32", model):
        assert any(FK.REFERENCE_FOR_TOPK in i for i in impls)
        assert FK.REFERENCE_INDEXER in impls  # the indexer went through the swap (the fused kernel needs CUDA)


def test_windows_take_the_band_kernel_unless_flash_is_asked_for(monkeypatch) -> None:
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(9, 2, 8, generator=g), torch.randn(20, 2, 8, generator=g), torch.randn(20, 2, 8, generator=g)
    ref = K.causal_attention(q, k, v, 0.3, window=4)
    for env, name in (("0", FK.WINDOWED), ("1", FK.WINDOWED_FLASH)):
        monkeypatch.setenv("TPPLAN_WINDOW_FLASH", env)
        got = FK.serving_attention(q, k, v, 0.3, 4, None, None)
        assert got is not None and got[0] == name and torch.allclose(got[1], ref, atol=1e-5)
