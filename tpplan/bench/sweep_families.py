"""The kernel sweeps' families: each times one op class over the shapes TP sizes produce (GPU only).

See `kernel_sweep` for what each sweep runs and why; every point is timed by `sweep_timing.timed`
and carries the clock it ran at where NVML is there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tpplan.bench.sweep_timing import each_call, last_clocks, timed


def attention_points(
    heads: Iterable[int], tokens: Iterable[int], contexts: Iterable[int], dims: Iterable[tuple[int, int]],
    reps: int = 7, impl: str = "sdpa",
) -> list[dict[str, Any]]:  # fmt: skip
    """Attention as the runtime calls it (`impl` "sdpa": SDPA with the lower-right causal mask) or as
    serving engines split it (`impl` "cascade": `bench.serving_kernels.cascade_attention`, checked
    against the runtime's result): q [T, H, dqk], k [S, H, dqk], v [S, H, dv], S = ctx + T."""
    import torch

    from tpplan.bench.serving_kernels import cascade_attention
    from tpplan.runtime import fast_kernels as F

    fn = cascade_attention if impl == "cascade" else F.causal_attention
    out: list[dict[str, Any]] = []
    for dqk, dv in dims:
        for h in heads:
            for t in tokens:
                for ctx in contexts:
                    s = ctx + t
                    q = torch.randn(t, h, dqk, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(s, h, dqk, device="cuda", dtype=torch.bfloat16)
                    v = torch.randn(s, h, dv, device="cuda", dtype=torch.bfloat16)
                    secs = timed(each_call(fn, q, k, v, dqk**-0.5), reps, 1)
                    row = {"family": "attention", "impl": impl, "heads": h, "tokens": t, "context": ctx, "dqk": dqk,
                           "dv": dv, "seconds": secs}  # fmt: skip
                    if impl == "cascade" and h in (96, 3) and t in (1024, 8192):
                        ref = F.causal_attention(q, k, v, dqk**-0.5).float()
                        got = fn(q, k, v, dqk**-0.5).float()
                        row["rel_err_vs_runtime"] = float((got - ref).norm() / ref.norm())
                    out.append(row)
                    del q, k, v
    return out


def kda_points(
    heads: Iterable[int], tokens: Iterable[int], reps: int = 7, d: int = 128, deadline: float = float("inf")
) -> list[dict[str, Any]]:
    """fla chunk_kda with a carried state (a second chunk), gates fused, as `runtime.fast_kernels.kda`
    (one fla build per head count, ~80 s: a head count is started only before `deadline`)."""
    import torch

    from tpplan.runtime import fast_kernels as F

    out: list[dict[str, Any]] = []
    for h in heads:
        if time.perf_counter() > deadline:
            return out
        for t in tokens:
            w = h * d
            q, k, v, f = (torch.randn(t, w, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            beta = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            a_log = torch.empty(h, device="cuda").uniform_(1.0, 16.0).log()
            dt = torch.empty(w, device="cuda").uniform_(-4.0, -1.0)
            init = torch.zeros(h, d, d, device="cuda")

            def call(_i: int, q=q, k=k, v=v, f=f, beta=beta, a_log=a_log, dt=dt, init=init) -> Any:
                st = {"recurrent": init}
                return F.kda(q, k, v, f, beta, head_dim=d, a_log=a_log, dt_bias=dt, state=st)

            t0 = time.perf_counter()
            call(0)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            secs = timed(call, reps, 1)
            out.append({"family": "kda", "heads": h, "tokens": t, "dk": d, "dv": d, "seconds": secs,
                        "first_call_s": first, **last_clocks()})  # fmt: skip
    return out


def gdn_points(
    k_heads: Iterable[int], tokens: Iterable[int], v_per_k: int = 2, reps: int = 5, d: int = 128,
    deadline: float = float("inf"),
) -> list[dict[str, Any]]:  # fmt: skip
    """The whole Gated DeltaNet op as the model's run calls it (`runtime.kernels.gdn`: the short conv,
    fla's chunk_gated_delta_rule with a carried state, the gated RMSNorm), Qwen3-Next's head dims;
    `heads` is the v heads per rank (the recurrence's state is per v head). One fla build per head
    count (~80 s): a head count is started only before `deadline`."""
    import torch

    from tpplan.runtime import kernels as K

    out: list[dict[str, Any]] = []
    for nk in k_heads:
        if time.perf_counter() > deadline:
            return out
        hv = nk * v_per_k
        conv_w = torch.randn(nk * (2 * d + v_per_k * d), 1, 4, device="cuda", dtype=torch.bfloat16) * 0.5
        a_log = torch.empty(hv, device="cuda").uniform_(1.0, 16.0).log()
        dtb = torch.empty(hv, device="cuda").uniform_(-4.0, -1.0)
        norm = torch.ones(d, device="cuda", dtype=torch.bfloat16)
        for t in tokens:
            qkvz = torch.randn(t, nk * (2 * d + 2 * v_per_k * d), device="cuda", dtype=torch.bfloat16)
            ba = torch.randn(t, nk * 2 * v_per_k, device="cuda", dtype=torch.bfloat16)
            init = torch.zeros(hv, d, d, device="cuda")

            w = {"conv_weight": conv_w, "a_log": a_log, "dt_bias": dtb, "norm_weight": norm}

            def call(_i: int, qkvz=qkvz, ba=ba, init=init, w=w) -> Any:
                return K.gdn(qkvz, ba, **w, eps=1e-6, k_head_dim=d, v_head_dim=d, v_per_k=v_per_k,
                             state={"recurrent": init})  # fmt: skip

            t0 = time.perf_counter()
            call(0)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            secs = timed(call, reps, 1)
            out.append({"family": "gdn", "heads": hv, "k_heads": nk, "tokens": t, "dk": d, "dv": d,
                        "seconds": secs, "first_call_s": first, **last_clocks()})  # fmt: skip
            del qkvz, ba, init
    return out


def kda_batched_points(
    heads: Iterable[int], tokens: Iterable[int], reps: int = 7, d: int = 128, deadline: float = float("inf")
) -> list[dict[str, Any]]:
    """fla chunk_kda at h heads per rank run as h sequences of one head ([h, T, 1, d]), with the runtime's
    arguments (state carried, gates and beta in the kernel, q/k l2-normalised in it).

    Why batched: fla's kernels take the head count as a compile-time constant and autotune per head
    count (~100 s each on an H200); every (sequence, head) pair is an independent program of the
    same grid, so h sequences of one head run the work of one sequence of h heads with one build."""
    import torch
    from fla.ops.kda import chunk_kda

    out: list[dict[str, Any]] = []
    for t in tokens:
        for h in heads:
            if time.perf_counter() > deadline:
                return out
            shp = (h, t, 1, d)
            q, k, v, f = (torch.randn(shp, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            beta = torch.randn(h, t, 1, device="cuda", dtype=torch.bfloat16)
            a_log = torch.empty(1, device="cuda").uniform_(1.0, 16.0).log()
            dt = torch.empty(d, device="cuda").uniform_(-4.0, -1.0)
            init = torch.zeros(h, 1, d, d, device="cuda")

            def call(_i: int, q=q, k=k, v=v, f=f, beta=beta, a_log=a_log, dt=dt, init=init) -> Any:
                with torch.no_grad():
                    return chunk_kda(q, k, v, f, beta, scale=d**-0.5, initial_state=init, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True, chunk_size=64, use_gate_in_kernel=True,
                                     use_beta_sigmoid_in_kernel=True, A_log=a_log, dt_bias=dt)  # fmt: skip

            t0 = time.perf_counter()
            call(0)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            out.append({"family": "kda", "heads": h, "tokens": t, "dk": d, "dv": d, "layout": "h sequences x 1 head",
                        "seconds": timed(call, reps, 1), "first_call_s": first})  # fmt: skip
            print(f"kda h={h} t={t}: {out[-1]['seconds'] * 1e3:.3f} ms (first call {first:.1f} s)", flush=True)
    return out


def conv_points(channels: Iterable[int], tokens: Iterable[int], reps: int = 7) -> list[dict[str, Any]]:
    """The runtime's short convolution (`runtime.kernels.short_conv`, kernel 4, SiLU) with carried state."""
    import torch

    from tpplan.runtime import kernels as K

    out: list[dict[str, Any]] = []
    for c in channels:
        for t in tokens:
            x = torch.randn(t, c, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(c, 1, 4, device="cuda", dtype=torch.bfloat16) * 0.3
            prev = torch.zeros(3, c, device="cuda", dtype=torch.bfloat16)
            secs = timed(each_call(K.short_conv, x, w, {"conv": prev}), reps, 1)
            out.append({"family": "short_conv", "channels": c, "tokens": t, "seconds": secs, **last_clocks()})
    return out


def norm_points(widths: Iterable[int], tokens: Iterable[int], reps: int = 7) -> list[dict[str, Any]]:
    """The runtime's RMSNorm (`runtime.kernels.rms_norm`: fla's fused kernel on CUDA) over [T, width]."""
    import torch

    from tpplan.runtime import kernels as K

    out: list[dict[str, Any]] = []
    for wd in widths:
        for t in tokens:
            x = torch.randn(t, wd, device="cuda", dtype=torch.bfloat16)
            w = torch.ones(wd, device="cuda", dtype=torch.bfloat16)
            secs = timed(each_call(K.rms_norm, x, w, 1e-6), reps, 1)
            out.append({"family": "norm", "width": wd, "tokens": t, "seconds": secs, **last_clocks()})
    return out


def attn_res_points(tokens: Iterable[int], banks: Iterable[int], hidden: int, reps: int = 7) -> list[dict[str, Any]]:
    """K3's attention residual as the runtime runs it (`runtime.kernels.attn_res`): softmax over depth
    of `bank` stored snapshots plus the running prefix, [T, hidden] each."""
    import torch

    from tpplan.runtime import kernels as K

    out: list[dict[str, Any]] = []
    for r in banks:
        for t in tokens:
            prefix = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
            bank = torch.randn(t, r, hidden, device="cuda", dtype=torch.bfloat16)
            proj = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
            norm = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
            secs = timed(each_call(K.attn_res, prefix, bank, proj, norm, 1e-5), reps, 1)
            out.append(
                {"family": "attn_res", "tokens": t, "bank": r, "hidden": hidden, "seconds": secs, **last_clocks()}
            )
    return out


def expert_points(
    experts_local: Iterable[int], tokens: Iterable[int], experts: int, top_k: int, width: int, inter: int,
    reps: int = 7,
) -> list[dict[str, Any]]:  # fmt: skip
    """Grouped expert GEMMs (gate, up, down) on the rows a rank's experts receive from `tokens` tokens."""
    import torch

    from tpplan.bench.serving_kernels import expert_ffn, grouped_gemm_used

    out: list[dict[str, Any]] = []
    for e_loc in experts_local:
        gate = torch.randn(e_loc, inter, width, device="cuda", dtype=torch.bfloat16) * 0.02
        up = torch.randn(e_loc, inter, width, device="cuda", dtype=torch.bfloat16) * 0.02
        down = torch.randn(e_loc, width, inter, device="cuda", dtype=torch.bfloat16) * 0.02
        for t in tokens:
            pick = torch.randn(t, experts, device="cuda").topk(top_k, dim=1).indices
            local = pick[pick < e_loc]
            counts = torch.bincount(local, minlength=e_loc)
            rows = int(counts.sum())
            if rows == 0:
                continue
            xs = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
            ws = (gate, up, down)
            secs = timed(each_call(expert_ffn, xs, counts, *ws), reps, 1)
            out.append({"family": "experts", "experts_local": e_loc, "tokens": t, "rows": rows,
                        "active": int((counts > 0).sum()), "max_rows": int(counts.max()), "width": width,
                        "inter": inter, "seconds": secs, "grouped": grouped_gemm_used().get("cuda")})  # fmt: skip
        del gate, up, down
        torch.cuda.empty_cache()
    return out


def mla_op_points(
    heads: Iterable[int], tokens: Iterable[int], contexts: Iterable[int], nope: int = 128, rope: int = 64,
    v_dim: int = 128, reps: int = 5,
) -> list[dict[str, Any]]:  # fmt: skip
    """The whole MLA attention op as the model's run calls it (`runtime.kernels.mla_attention`: rope,
    the q/k concatenations, the KV-cache append of `context` cached rows, MLA's v padding and SDPA),
    each call with a fresh cache holding `context` rows, so the append copies what it copies in a run."""
    import torch

    from tpplan.runtime import kernels as K

    rp = K.Rope(theta=50000.0)
    out: list[dict[str, Any]] = []
    for h in heads:
        for t in tokens:
            for ctx in contexts:
                q = torch.randn(t, h * (nope + rope), device="cuda", dtype=torch.bfloat16)
                kv = torch.randn(t, h * (nope + v_dim), device="cuda", dtype=torch.bfloat16)
                kr = torch.randn(t, rope, device="cuda", dtype=torch.bfloat16)
                pos = torch.arange(ctx, ctx + t, device="cuda")
                kc = torch.randn(ctx, h, nope + rope, device="cuda", dtype=torch.bfloat16)
                vc = torch.randn(ctx, h, v_dim, device="cuda", dtype=torch.bfloat16)

                def call(_i: int, q=q, kv=kv, kr=kr, pos=pos, kc=kc, vc=vc, ctx=ctx) -> Any:
                    cache = {"k": kc, "v": vc} if ctx else {}
                    return K.mla_attention(q, kv, kr, nope_dim=nope, rope_dim=rope, v_dim=v_dim, positions=pos,
                                           rope=rp, scale=(nope + rope) ** -0.5, cache=cache)  # fmt: skip

                secs = timed(call, reps, 1)
                out.append({"family": "attention", "impl": "sdpa", "op": "mla_attention", "heads": h,
                            "tokens": t, "context": ctx, "dqk": nope + rope, "dv": v_dim, "seconds": secs,
                            **last_clocks()})  # fmt: skip
                del q, kv, kr, kc, vc
    return out


def experts_op_points(
    shapes: Iterable[tuple[int, int, int, int, int]], tokens: Iterable[int], reps: int = 5
) -> list[dict[str, Any]]:
    """The whole routed-experts op as the bench runs it (`bench.serving_kernels.grouped_routed_experts`:
    routing sort and gather, grouped GEMMs, weighted combine) for (experts routed over, experts on
    this rank, top-k, width, intermediate): a dense [T, E] routing from random router logits, the
    rank's first `local` columns."""
    import torch

    from tpplan.bench.serving_kernels import grouped_routed_experts

    out: list[dict[str, Any]] = []
    for experts, local, top_k, width, inter in shapes:
        gate = torch.randn(local, inter, width, device="cuda", dtype=torch.bfloat16) * 0.02
        up = torch.randn(local, inter, width, device="cuda", dtype=torch.bfloat16) * 0.02
        down = torch.randn(local, width, inter, device="cuda", dtype=torch.bfloat16) * 0.02
        for t in tokens:
            logits = torch.randn(t, experts, device="cuda")
            idx = logits.topk(top_k, dim=1).indices
            routing = torch.zeros(t, experts, device="cuda").scatter_(1, idx, 1.0 / top_k)[:, :local].contiguous()
            counts = (routing != 0).sum(0)
            rows = int(counts.sum())
            if rows == 0:
                continue
            x = torch.randn(t, width, device="cuda", dtype=torch.bfloat16)
            ws = (gate, up, down)
            secs = timed(each_call(grouped_routed_experts, x, routing, *ws), reps, 1)
            out.append({"family": "experts", "op": "routed_experts", "experts": experts, "experts_local": local,
                        "top_k": top_k, "tokens": t, "rows": rows, "active": int((counts > 0).sum()),
                        "max_rows": int(counts.max()), "width": width, "inter": inter, "seconds": secs,
                        **last_clocks()})  # fmt: skip
        del gate, up, down
        torch.cuda.empty_cache()
    return out


__all__ = [
    "attention_points",
    "attn_res_points",
    "conv_points",
    "expert_points",
    "experts_op_points",
    "gdn_points",
    "kda_batched_points",
    "kda_points",
    "mla_op_points",
    "norm_points",
]
