"""Time the serving-class kernels the bench runs, op by op, over the shapes TP sizes produce (GPU only).

Why: the cost model's physical models (`tpplan.cost.kernel_models`) are fitted on isolated kernel
timings and must be checked where they were not fitted. One sweep covers, at the shapes a rank
of each TP size runs:

- `gemm`: the probe shapes of `tpplan calibrate --quick` (`gemm_probe`), measured/table;
- `attention`: `runtime.fast_kernels.causal_attention` (SDPA flash; MLA's v zero-padded to the
  q/k head dim, lower-right causal mask over a KV cache) by heads per rank, tokens, context, dims;
- `kda`: fla's chunked KDA (state carried, gates fused in the kernel) by heads per rank and tokens,
  down to one head: as h one-head sequences (`kda_batched_points`, one build) or through
  `runtime.fast_kernels.kda` in the runtime's layout (`kda_points`, one build per head count);
- `short_conv`, `attn_res`: the runtime's paths (`kernels.short_conv`, `kernels.attn_res`: fla's
  kernels on CUDA where fla has them, else torch);
- `experts`: `bench.serving_kernels.expert_ffn` (`torch._grouped_mm`) by experts per rank and tokens
  routed (top-k of the model's experts, random router logits).

Sweep 2 (`ops` mode) times the ops as the model's run calls them instead: the whole MLA op
(`mla_op_points`), the whole routed-experts op with its routing (`experts_op_points`), KDA in the
runtime's layout, conv, AttnRes and RMSNorm, each with the host ahead of the GPU (`HOST_AHEAD`, see
`_timed`) and, where NVML is there, the SM clock each point ran at (`clocks.Sampler`).

Each point: a warm-up call (builds kernels; Triton's autotuning is cached in TRITON_CACHE_DIR),
then the median of `reps` event-timed calls, each on one of several input sets in turn when the
inputs are small enough to sit in L2. `run_sweep` keeps to a time budget and writes after every
family, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tpplan.outputs import write_files

SWEEP_VERSION = 1


# Sweep 2 ("ops" mode) times every call with the host ahead of the GPU (see `_timed`).
HOST_AHEAD = [False]
# A running `clocks.Sampler` (ops mode, where NVML is there): each timed point records its clock.
SAMPLER: list[Any] = [None]
_LAST_CLOCKS: list[dict[str, Any] | None] = [None]


def _clocks() -> dict[str, Any]:
    """The SM clock, power and temperature of the last timed point (empty without a sampler)."""
    c = _LAST_CLOCKS[0]
    return {} if c is None else {"clocks": c}


AHEAD_SLEEP_CYCLES = 40_000_000  # ~20 ms at the H200's 1.98 GHz: longer than the host takes to queue `reps` calls
# What the GPU runs before each timed batch instead of the sleep (the "loaded" families): None = sleep.
PREAMBLE: list[Callable[[], Any] | None] = [None]


def gemm_load(ms: float = 150.0) -> Callable[[], Any]:
    """A preamble of ~`ms` of bf16 8192^3 GEMMs (~1.4 ms each on an H200): the GPU at full power, as
    inside a large model's run, before the timed calls (the sleep preamble leaves it near idle power)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        for _ in range(max(1, int(ms / 1.4))):
            torch.mm(a, b, out=c)

    return run


def _timed(fn: Callable[[int], Any], reps: int, sets: int) -> float:
    """Seconds per call of fn(i % sets), queued back to back as inside a model's run: events around
    `reps` calls (no host sync between them), the median of 3 such batches, after a warm-up per set.

    Timing one call at a time with a host sync between leaves the GPU idle between calls, and small
    kernels then measure launch latency and clock ramp-up too (seen on an H200: a [256, 7168] x
    [7168, 2112] GEMM ran 24% slower timed alone than queued behind another kernel).

    With `HOST_AHEAD` the GPU is first given ~20 ms of sleep, so the host has queued every call
    before the GPU reaches them and the events measure GPU time alone: what an op takes inside a
    run whose large kernels keep the GPU behind the host (a K3 8K pass on one H200 left the GPU
    idle 2.9% of the time). Without it, an op whose Python and launches take longer than its
    kernels measures the host (fla's short conv: 0.4 ms back to back, 0.19 ms inside the model)."""
    import torch

    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()
    per, spans = [], []
    for _ in range(3):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if PREAMBLE[0] is not None:
            PREAMBLE[0]()
        elif HOST_AHEAD[0]:
            torch.cuda._sleep(AHEAD_SLEEP_CYCLES)
        a.record()
        for i in range(reps):
            fn(i % sets)
        b.record()
        b.synchronize()
        t1, secs = time.perf_counter(), a.elapsed_time(b) / 1e3
        spans.append((t1 - secs, t1))  # when the GPU ran the timed calls (not the preamble), host clock
        per.append(secs / reps)
    _LAST_CLOCKS[0] = None if SAMPLER[0] is None else SAMPLER[0].window(spans)
    return statistics.median(per)


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
    out = []
    for dqk, dv in dims:
        for h in heads:
            for t in tokens:
                for ctx in contexts:
                    s = ctx + t
                    q = torch.randn(t, h, dqk, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(s, h, dqk, device="cuda", dtype=torch.bfloat16)
                    v = torch.randn(s, h, dv, device="cuda", dtype=torch.bfloat16)
                    secs = _timed(lambda _i, q=q, k=k, v=v, d=dqk: fn(q, k, v, d**-0.5), reps, 1)
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

    out = []
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
            secs = _timed(call, reps, 1)
            out.append({"family": "kda", "heads": h, "tokens": t, "dk": d, "dv": d, "seconds": secs,
                        "first_call_s": first, **_clocks()})  # fmt: skip
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

    out = []
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
            secs = _timed(call, reps, 1)
            out.append({"family": "gdn", "heads": hv, "k_heads": nk, "tokens": t, "dk": d, "dv": d,
                        "seconds": secs, "first_call_s": first, **_clocks()})  # fmt: skip
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

    out = []
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
                        "seconds": _timed(call, reps, 1), "first_call_s": first})  # fmt: skip
            print(f"kda h={h} t={t}: {out[-1]['seconds'] * 1e3:.3f} ms (first call {first:.1f} s)", flush=True)
    return out


def conv_points(channels: Iterable[int], tokens: Iterable[int], reps: int = 7) -> list[dict[str, Any]]:
    """The runtime's short convolution (`runtime.kernels.short_conv`, kernel 4, SiLU) with carried state."""
    import torch

    from tpplan.runtime import kernels as K

    out = []
    for c in channels:
        for t in tokens:
            x = torch.randn(t, c, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(c, 1, 4, device="cuda", dtype=torch.bfloat16) * 0.3
            prev = torch.zeros(3, c, device="cuda", dtype=torch.bfloat16)
            secs = _timed(lambda _i, x=x, w=w, prev=prev: K.short_conv(x, w, {"conv": prev}), reps, 1)
            out.append({"family": "short_conv", "channels": c, "tokens": t, "seconds": secs, **_clocks()})
    return out


def norm_points(widths: Iterable[int], tokens: Iterable[int], reps: int = 7) -> list[dict[str, Any]]:
    """The runtime's RMSNorm (`runtime.kernels.rms_norm`: fla's fused kernel on CUDA) over [T, width]."""
    import torch

    from tpplan.runtime import kernels as K

    out = []
    for wd in widths:
        for t in tokens:
            x = torch.randn(t, wd, device="cuda", dtype=torch.bfloat16)
            w = torch.ones(wd, device="cuda", dtype=torch.bfloat16)
            secs = _timed(lambda _i, x=x, w=w: K.rms_norm(x, w, 1e-6), reps, 1)
            out.append({"family": "norm", "width": wd, "tokens": t, "seconds": secs, **_clocks()})
    return out


def attn_res_points(tokens: Iterable[int], banks: Iterable[int], hidden: int, reps: int = 7) -> list[dict[str, Any]]:
    """K3's attention residual as the runtime runs it (`runtime.kernels.attn_res`): softmax over depth
    of `bank` stored snapshots plus the running prefix, [T, hidden] each."""
    import torch

    from tpplan.runtime import kernels as K

    out = []
    for r in banks:
        for t in tokens:
            prefix = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
            bank = torch.randn(t, r, hidden, device="cuda", dtype=torch.bfloat16)
            proj = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
            norm = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
            secs = _timed(lambda _i, a=prefix, b=bank, c=proj, d=norm: K.attn_res(a, b, c, d, 1e-5), reps, 1)
            out.append({"family": "attn_res", "tokens": t, "bank": r, "hidden": hidden, "seconds": secs, **_clocks()})
    return out


def expert_points(
    experts_local: Iterable[int], tokens: Iterable[int], experts: int, top_k: int, width: int, inter: int,
    reps: int = 7,
) -> list[dict[str, Any]]:  # fmt: skip
    """Grouped expert GEMMs (gate, up, down) on the rows a rank's experts receive from `tokens` tokens."""
    import torch

    from tpplan.bench.serving_kernels import expert_ffn, grouped_gemm_used

    out = []
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
            secs = _timed(lambda _i, xs=xs, counts=counts, ws=ws: expert_ffn(xs, counts, *ws), reps, 1)
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
    out = []
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

                secs = _timed(call, reps, 1)
                out.append({"family": "attention", "impl": "sdpa", "op": "mla_attention", "heads": h, "tokens": t,
                            "context": ctx, "dqk": nope + rope, "dv": v_dim, "seconds": secs, **_clocks()})  # fmt: skip
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

    out = []
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
            secs = _timed(lambda _i, x=x, r=routing, ws=ws: grouped_routed_experts(x, r, *ws), reps, 1)
            out.append({"family": "experts", "op": "routed_experts", "experts": experts, "experts_local": local,
                        "top_k": top_k, "tokens": t, "rows": rows, "active": int((counts > 0).sum()),
                        "max_rows": int(counts.max()), "width": width, "inter": inter, "seconds": secs,
                        **_clocks()})  # fmt: skip
        del gate, up, down
        torch.cuda.empty_cache()
    return out


def loaded(points: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`points()` with the GPU-load preamble (`gemm_load`) before every timed batch, each row tagged
    "preamble": "gemm" -- the same calls as the plain family, so the pair isolates power and clock."""
    PREAMBLE[0] = gemm_load()
    try:
        return [{**r, "preamble": "gemm"} for r in points()]
    finally:
        PREAMBLE[0] = None


def run_sweep(
    out: Path, budget_s: float, families: dict[str, Callable[[], list[dict[str, Any]]]], timing: str = "back to back"
) -> dict[str, Any]:
    """Run each family in order while the budget lasts; write `out` after each (partial runs keep data)."""
    import torch

    doc: dict[str, Any] = {
        "version": SWEEP_VERSION,
        "gpu": torch.cuda.get_device_name(),
        "gpu_uuid": str(getattr(torch.cuda.get_device_properties(0), "uuid", "")),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing": timing,
        "points": [],
        "skipped": [],
        "family_s": {},
    }
    start = time.perf_counter()
    for name, fn in families.items():
        if time.perf_counter() - start > budget_s:
            doc["skipped"].append(name)
            continue
        t0 = time.perf_counter()
        try:
            doc["points"] += fn()
        except Exception as exc:  # a family that fails (missing fla, OOM) is reported, the rest still run
            doc["skipped"].append(f"{name}: {type(exc).__name__}: {exc}")
        doc["family_s"][name] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {doc['family_s'][name]} s, {len(doc['points'])} points", flush=True)
        write_files({out: json.dumps(doc, indent=1) + "\n"}, "OUT.json")  # recorded, so the next family may replace it
        torch.cuda.empty_cache()
    return doc


def main(argv: list[str] | None = None) -> None:
    """`python -m tpplan.bench.kernel_sweep OUT.json BUDGET_S [MODE]`: the sweep of docs/benchmarks.md (K3
    shapes at TP1..TP32 per rank; heads per rank 96/TP for K3's KDA and MLA). MODE `in-model-shapes`:
    sweep 1's check at the TP1 bench's shapes; `ops [KDA_HEADS [FAMILIES]]`: sweep 2, the ops as the
    model's run calls them, timed with the host ahead (KDA_HEADS e.g. 96,12,3; FAMILIES e.g. kda_runtime)."""
    import sys

    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file

    args = sys.argv[1:] if argv is None else argv
    try:
        out, budget = check_file("OUT.json", args[0]), float(args[1])  # before any GPU work
    except TpplanError as exc:
        sys.exit(f"error: {exc}")
    from tpplan.bench.gemm_probe import probe

    def gemm() -> list[dict[str, Any]]:
        return [{"family": "gemm", "m": p.m, "k": p.k, "n": p.n, "warm_tflops": p.warm_tflops,
                 "cold_tflops": p.cold_tflops, "table_tflops": p.table_tflops} for p in probe()]  # fmt: skip

    k3_heads = (96, 48, 24, 12, 6, 3)
    start = time.perf_counter()
    dims = ((192, 128), (128, 128))
    tok = (1024, 2048, 4096, 8192)
    families: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "gemm": gemm,
        "attention": lambda: attention_points(k3_heads, tok, (0, 8192, 16384), dims),
        "attention_cascade": lambda: attention_points(k3_heads, tok, (0, 8192, 16384), dims, impl="cascade"),
        "kda": lambda: kda_batched_points(
            (96, 48, 24, 12, 6, 3, 2, 1), (8192, 4096, 2048, 1024), deadline=start + budget * 0.8
        ),
        "experts": lambda: expert_points((448, 224, 112, 56, 28, 14), tok, 896, 16, 3584, 3072),
        "short_conv": lambda: conv_points((12288, 3072, 768, 384), (1024, 4096, 8192)),
        "experts_tp": lambda: expert_points((896,), (1024, 4096, 8192), 896, 16, 3584, 384),
    }
    if len(args) > 2 and args[2] == "ops":  # sweep 2: the ops as the model's run calls them (see the docstring)
        kda_heads = tuple(int(h) for h in args[3].split(",")) if len(args) > 3 else (96, 12, 3)
        k3 = (3584, 3072)
        HOST_AHEAD[0] = True
        families = {
            "attention_op": lambda: mla_op_points(k3_heads, tok, (0, 4096, 8192, 16384)),
            "experts_op": lambda: experts_op_points(
                [(e, e, 16, *k3) for e in (256, 128, 64, 32)]
                + [(896, e, 16, *k3) for e in (224, 112, 56)]
                + [(256, 256, 8, 2304, 1024), (256, 64, 8, 2304, 1024)],
                tok,
            ),  # Kimi-Linear's experts
            "short_conv": lambda: conv_points((12288, 4096, 1536, 384), tok),
            "attn_res": lambda: attn_res_points(tok, (1, 2, 4, 8), 7168),
            "norm": lambda: norm_points((7168, 2304, 12288, 1536, 512), tok),
            "kda_runtime": lambda: kda_points(
                kda_heads, (8192, 4096, 2048, 1024), reps=5, deadline=start + budget - 100
            ),
        }
        # Qwen3-Next's GDN at 16 and 2 key heads per rank (TP1, TP8), two v heads each.
        families["gdn"] = lambda: gdn_points((16, 2), (8192, 4096, 2048, 1024), deadline=start + budget - 100)
        # The same calls behind a GEMM load instead of the sleep (`loaded`): power and clock as in a run.
        load = ("attention_op", "experts_op", "short_conv", "norm", "attn_res", "kda_runtime", "gdn")
        families |= {f"{name}_loaded": (lambda f=families[name]: loaded(f)) for name in load}
    if len(args) > 2 and args[2] == "in-model-shapes":  # the shapes the TP1 bench runs, for the model's check
        families = {
            "experts_dense": lambda: (
                expert_points((128,), (1024, 4096, 8192), 128, 16, 3584, 3072)
                + expert_points((256,), (1024, 4096, 8192), 256, 16, 3584, 3072)
            ),
            "attn_res": lambda: attn_res_points((1024, 4096, 8192), (1, 2, 4), 7168),
            "kda_runtime": lambda: kda_points((96, 48, 24, 12, 6, 3), (8192, 2048), reps=5),
        }
    if len(args) > 4 and args[2] == "ops":  # a comma list of the families to run
        families = {k: families[k] for k in args[4].split(",") if k in families}  # in the order given
    from contextlib import nullcontext

    from tpplan.bench.clocks import sampling

    with sampling() if HOST_AHEAD[0] else nullcontext() as SAMPLER[0]:
        doc = run_sweep(out, budget, families, timing="host ahead" if HOST_AHEAD[0] else "back to back")
    SAMPLER[0] = None
    print(f"{len(doc['points'])} points; skipped: {doc['skipped']}")


if __name__ == "__main__":
    main()


__all__ = [
    "attention_points",
    "conv_points",
    "expert_points",
    "experts_op_points",
    "gdn_points",
    "kda_batched_points",
    "kda_points",
    "loaded",
    "mla_op_points",
    "norm_points",
    "run_sweep",
]
