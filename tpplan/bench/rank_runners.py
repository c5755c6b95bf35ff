"""How `rank_sweep` times each op class: one runner per family, from cases to timed points.

Each runner builds the inputs of one case, calls the kernel the bench's serving path uses for that op
class, and returns the case with `rank_sweep.measure`'s times. fla's recurrences need CUDA; every other
runner also runs (tiny cases) on the CPU for the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpplan.bench.rank_timing import DEVICE, Case, _randn, measure


def run_attention(c: Case) -> dict[str, Any]:
    """`runtime.fast_kernels.causal_attention` (SDPA flash, MLA's v padded, lower-right causal mask)."""
    from tpplan.runtime import fast_kernels as F

    h, t, s = c["heads"], c["tokens"], c["tokens"] + c["context"]
    q, k, v = _randn(t, h, c["dqk"]), _randn(s, h, c["dqk"]), _randn(s, h, c["dv"])
    return measure(lambda: F.causal_attention(q, k, v, c["dqk"] ** -0.5), both=False)


def run_kda(c: Case) -> dict[str, Any]:
    """fla chunk_kda as h one-head sequences (one build for every head count), the runtime's arguments."""
    import torch
    from fla.ops.kda import chunk_kda

    h, t, d = c["heads"], c["tokens"], c["d"]
    q, k, v, f = (_randn(h, t, 1, d) for _ in range(4))
    beta = _randn(h, t, 1)
    a_log = torch.empty(1, device=DEVICE[0]).uniform_(1.0, 16.0).log()
    dt = torch.empty(d, device=DEVICE[0]).uniform_(-4.0, -1.0)
    init = torch.zeros(h, 1, d, d, device=DEVICE[0])

    def call() -> Any:
        with torch.no_grad():
            return chunk_kda(q, k, v, f, beta, scale=d**-0.5, initial_state=init, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, chunk_size=64, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, A_log=a_log, dt_bias=dt)  # fmt: skip

    return measure(call)


def run_gdn(c: Case) -> dict[str, Any]:
    """Gated DeltaNet's whole op per rank: the short conv over q, k, v channels, fla's
    chunk_gated_delta_rule (h v-head sequences of one head each, gates in the kernel) and the gated
    RMSNorm, as `runtime.kernels.gdn` runs them (the layout changes between them left out)."""
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from tpplan.runtime import kernels as K

    hv, t, d, r = c["heads"], c["tokens"], c["d"], c["v_per_k"]
    ch = max(1, hv // r) * 2 * d + hv * d
    x, w, prev = _randn(t, ch), _randn(ch, 1, 4, scale=0.3), torch.zeros(3, ch, device=DEVICE[0], dtype=torch.bfloat16)
    q, k, v = (_randn(hv, t, 1, d) for _ in range(3))
    a, b = _randn(hv, t, 1), _randn(hv, t, 1)
    a_log = torch.empty(1, device=DEVICE[0]).uniform_(1.0, 16.0).log()
    dtb = torch.empty(1, device=DEVICE[0]).uniform_(-4.0, -1.0)
    init = torch.zeros(hv, 1, d, d, device=DEVICE[0])
    o, z, nw = _randn(t, hv * d), _randn(t, hv * d), torch.ones(d, device=DEVICE[0], dtype=torch.bfloat16)

    def call() -> Any:
        K.short_conv(x, w, {"conv": prev})
        with torch.no_grad():
            chunk_gated_delta_rule(q, k, v, a, b, scale=d**-0.5, initial_state=init, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, chunk_size=64, use_gate_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, A_log=a_log, dt_bias=dtb)  # fmt: skip
        return K.head_rms_norm(o, nw, 1e-6, d, gate=z, gate_fn="silu")

    return measure(call)


def run_experts(c: Case) -> dict[str, Any]:
    """The routed-experts op as the bench runs it (`grouped_routed_experts`, random router logits, the
    rank's first `local` experts), then its parts: the grouped GEMMs alone on the gathered rows
    (`ffn_s`) and the fused-MoE engines' combine alone (`combine_s`: [T, k, W] rows weighted and summed)."""
    import torch

    from tpplan.bench import serving_kernels as SK
    from tpplan.bench.serving_kernels import expert_ffn, grouped_routed_experts

    # A shape that `torch._grouped_mm` refuses (an intermediate slice not a multiple of 8, e.g. gpt-oss's
    # 2880 / 32 = 90) runs the per-expert loop: each case records which path it ran (`grouped`).
    SK.reset_expert_paths()

    e, loc, kk, wd, inter, t = c["experts"], c["local"], c["top_k"], c["width"], c["inter"], c["tokens"]
    gate, up, down = (
        _randn(loc, inter, wd, scale=0.02),
        _randn(loc, inter, wd, scale=0.02),
        _randn(loc, wd, inter, scale=0.02),
    )
    idx = torch.randn(t, e, device=DEVICE[0]).topk(kk, dim=1).indices
    routing = torch.zeros(t, e, device=DEVICE[0]).scatter_(1, idx, 1.0 / kk)[:, :loc].contiguous()
    counts = (routing != 0).sum(0)
    rows = int(counts.sum())
    if rows == 0:
        return {"seconds": 0.0, "skipped": "no rows routed here"}
    x = _randn(t, wd)
    hint = kk if loc == e else None
    res = measure(lambda: grouped_routed_experts(x, routing, gate, up, down, top_k=hint))
    xs = _randn(rows, wd)
    res["ffn_s"] = measure(lambda: expert_ffn(xs, counts, gate, up, down), both=False)["seconds"]
    ys, wk = _randn(t, kk, wd), _randn(t, 1, kk)
    res["combine_s"] = measure(lambda: torch.bmm(wk, ys), both=False)["seconds"]
    res.update(rows=rows, active=int((counts > 0).sum()), max_rows=int(counts.max()),
               grouped=SK.grouped_gemm_used().get(DEVICE[0]))  # fmt: skip
    return res


def run_norm(c: Case) -> dict[str, Any]:
    """The runtime's RMSNorm (`runtime.kernels.rms_norm`: fla's fused kernel on CUDA) over [T, width]."""
    import torch

    from tpplan.runtime import kernels as K

    x, w = _randn(c["tokens"], c["width"]), torch.ones(c["width"], device=DEVICE[0], dtype=_randn(1).dtype)
    return measure(lambda: K.rms_norm(x, w, 1e-6))


def run_conv(c: Case) -> dict[str, Any]:
    """The runtime's short conv (`runtime.kernels.short_conv`, kernel 4, SiLU, carried state)."""
    import torch

    from tpplan.runtime import kernels as K

    ch = c["channels"]
    x, w = _randn(c["tokens"], ch), _randn(ch, 1, 4, scale=0.3)
    prev = torch.zeros(3, ch, device=DEVICE[0], dtype=x.dtype)
    return measure(lambda: K.short_conv(x, w, {"conv": prev}))


def run_elementwise(c: Case) -> dict[str, Any]:
    """torch's residual add and SwiGLU's silu(g) * u (unfused, as tpplan's runtime runs them) over [T, width]."""
    import torch.nn.functional as F

    a, b = _randn(c["tokens"], c["width"]), _randn(c["tokens"], c["width"])
    fn = (lambda: a + b) if c["op"] == "add" else (lambda: F.silu(a) * b)
    return measure(fn)


def run_attn_res(c: Case) -> dict[str, Any]:
    """K3's attention residual as the runtime runs it (`runtime.kernels.attn_res`)."""
    import torch

    from tpplan.runtime import kernels as K

    t, r, hd = c["tokens"], c["bank"], c["hidden"]
    prefix, bank, proj = _randn(t, hd), _randn(t, r, hd), _randn(1, hd)
    norm = torch.ones(hd, device=DEVICE[0], dtype=prefix.dtype)
    return measure(lambda: K.attn_res(prefix, bank, proj, norm, 1e-5))


def run_gemm(c: Case) -> dict[str, Any]:
    """A bf16 GEMM [m, k] x [k, n] through torch.mm (cuBLAS), as the per-rank projection runs."""
    import torch

    a, b = _randn(c["m"], c["k"]), _randn(c["k"], c["n"])
    return measure(lambda: torch.mm(a, b), both=False)


def run_masked(c: Case) -> dict[str, Any]:
    """A sliding-window or chunked attention (with gpt-oss's sinks where the model has them) by the bench's
    kernel for it (`serving_kernels.serving_attention`: the engines' FA3 where loaded, else fla's window kernel
    on CUDA where fla imports, each with the rank's KV heads once each, else the band-mask window; flash per
    chunk); the kernel's name is kept (`variant`)."""
    import torch

    from tpplan.bench.gpu_kernels import takes_gqa
    from tpplan.bench.serving_kernels import serving_attention
    from tpplan.runtime.kernels_attention import repeat_kv

    h, t, s, d = c["heads"], c["tokens"], c["tokens"] + c["context"], c["d"]
    kv = int(c.get("kv_heads") or h)
    q, k, v = _randn(t, h, d), _randn(s, kv, d), _randn(s, kv, d)
    sinks = torch.randn(h, device=DEVICE[0]) if c["sinks"] else None
    window, chunk = c["window"] or None, c["chunk"] or None
    if not takes_gqa(q, v, window, chunk, sinks):  # the other kernels take k/v repeated (not timed here)
        k, v = repeat_kv(k, v, h)
    picked = serving_attention(q, k, v, d**-0.5, window, chunk, sinks)
    name = picked[0] if picked is not None else "reference"
    return {**measure(lambda: serving_attention(q, k, v, d**-0.5, window, chunk, sinks), both=False), "variant": name}


def run_indexer(c: Case) -> dict[str, Any]:
    """DSA's lightning indexer as the bench runs it (`gpu_kernels.serving_indexer`: the fused Triton index
    scores + torch.topk on CUDA where triton imports, else the reference's fp32 scores by query block and
    stable sort), `context` keys already cached (in the dtype that kernel keeps); the kernel's name is kept
    (`variant`). The reference gets fewer repeats: one call at 32K tokens is ~0.6 s."""
    import torch

    from tpplan.bench.gpu_kernels import FUSED_INDEXER, REFERENCE_INDEXER, fused_indexer_ok, serving_indexer
    from tpplan.runtime.kernels_local import Rope

    h, t, ctx, d = c["heads"], c["tokens"], c["context"], c["d"]
    q, k, w = _randn(t, h * d), _randn(t, d), _randn(t, h)
    ones, zeros = torch.ones(d, device=DEVICE[0]), torch.zeros(d, device=DEVICE[0])
    pos = torch.arange(ctx, ctx + t, device=DEVICE[0])
    kw = {"head_dim": d, "rope_dim": 64, "positions": pos, "rope": Rope(), "topk": c["topk"],
          "k_norm_weight": ones, "k_norm_bias": zeros}  # fmt: skip
    name = FUSED_INDEXER if fused_indexer_ok(q, d) else REFERENCE_INDEXER
    prior = _randn(ctx, d) if name == FUSED_INDEXER else _randn(ctx, d).float()

    def call() -> Any:
        return serving_indexer(q, k, w, **kw, cache={"k": prior} if ctx else {})[1]

    return {**measure(call, reps=5 if name == FUSED_INDEXER else 2, both=False), "variant": name}


def run_sparse(c: Case) -> dict[str, Any]:
    """DSA's sparse attention in the engines' absorbed MQA 576/512 form: `heads` queries of 576 per token, one
    latent row per key (values its first 512), `topk` selected earlier keys per query (random, int32). By
    FlashMLA's sparse prefill where the engine kernels are loaded (`gpu_kernels.try_engine_sparse`), else the
    bench's Triton kernel on CUDA, else (CPU tests) the reference over a top-k mask; the kernel's name is kept
    (`variant`)."""
    import torch

    from tpplan.bench import engine_kernels as EK
    from tpplan.bench import gpu_kernels as GK
    from tpplan.runtime import kernels_attention as KA

    h, t, s = c["heads"], c["tokens"], c["tokens"] + c["context"]
    q, kv = _randn(t, h, EK.LATENT + EK.ROPE), _randn(s, 1, EK.LATENT + EK.ROPE)
    v, scale = kv[..., : EK.LATENT], (EK.LATENT + EK.ROPE) ** -0.5
    pos = torch.arange(s - t, s, device=DEVICE[0])
    idx = (torch.rand(t, c["topk"], device=DEVICE[0]) * (pos[:, None] + 1)).to(torch.int32)
    if GK.try_engine_sparse(q, kv, v, scale, idx) is not None:  # it runs here: FlashMLA alone is timed
        qa, kva, ixa = EK.absorbed_form(q, kv, idx)
        res = measure(lambda: EK.flashmla_sparse(qa, kva, ixa, scale), both=False)
        return {**res, "variant": EK.FLASHMLA_SPARSE}
    kernel = GK._sparse_kernel() if GK.sparse_attention_ok(q) else None
    if kernel is not None:
        return {**measure(lambda: kernel(q, kv, v, idx, scale), both=False), "variant": GK.SPARSE_ATTENTION}
    keep, (kk, vv) = KA.index_mask(idx, s), KA.repeat_kv(kv, v, h)
    return {**measure(lambda: KA.causal_attention(q, kk, vv, scale, keep), both=False), "variant": "reference"}


RUNNERS: dict[str, Callable[[Case], dict[str, Any]]] = {
    "attention": run_attention, "kda": run_kda, "gdn": run_gdn, "experts": run_experts, "norm": run_norm,
    "short_conv": run_conv, "elementwise": run_elementwise, "attn_res": run_attn_res, "gemm": run_gemm,
    "masked": run_masked, "indexer": run_indexer, "sparse": run_sparse,
}  # fmt: skip

__all__ = ["RUNNERS"]
