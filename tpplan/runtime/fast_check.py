"""GPU self-check of the fast kernels: accuracy against the references and speed, at K3 / Qwen3-Next widths.

    python -m tpplan.runtime.fast_check [--tokens 8192 --chunks 2 --hidden 7168 --json out.json]

For each fast path and each input dtype (fp32, bf16) it runs the reference (`fast_kernels.disabled()`)
and the fast path on the same inputs, over `--chunks` chunks with carried state where the op has one,
and reports max abs error, error relative to max |ref|, the first call's wall time (Triton compile +
autotune) and the median of CUDA-event timings after warm-up. Exits 1 if any case exceeds its tolerance.
Without fla the fla-backed ops are reported as "fla not importable" and the torch paths still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import tpplan.runtime.kernels as K
from tpplan.runtime import fast_kernels as fast

# Tolerance on max|fast - ref| / max|ref| per input dtype. fla's fp32 path may use TF32 and approx softplus.
TOL = {"float32": 2e-3, "bfloat16": 3e-2}
TOL_FLA = {"float32": 1e-2, "bfloat16": 5e-2}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _cuda_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median milliseconds of `fn` over `reps` CUDA-event timings (wall clock on a CPU smoke run)."""
    times = []
    if not torch.cuda.is_available():
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        _sync()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _err(out: Any, want: Any) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) over tensors or tuples of tensors."""
    outs = out if isinstance(out, tuple | list) else (out,)
    wants = want if isinstance(want, tuple | list) else (want,)
    abs_e, rel_e = 0.0, 0.0
    for o, w in zip(outs, wants, strict=True):
        d = (o.float() - w.float()).abs().max().item()
        m = w.float().abs().max().item()
        abs_e, rel_e = max(abs_e, d), max(rel_e, d / max(m, 1e-30))
    return abs_e, rel_e


def _chunked(step: Callable[[int, dict[str, torch.Tensor] | None], torch.Tensor], chunks: int, with_state: bool):
    """A callable running `step(i, state)` over the chunks with one fresh state dict; returns (outs..., state...)."""

    def run() -> tuple[torch.Tensor, ...]:
        state: dict[str, torch.Tensor] | None = {} if with_state else None
        outs = [step(i, state) for i in range(chunks)]
        tail = tuple(state[k] for k in sorted(state)) if state else ()
        return (torch.cat(outs, dim=0), *tail)

    return run


def _dt_bias(n: int, g: torch.Generator, dev: str) -> torch.Tensor:
    """Mamba-style init used by Kimi-Linear and Qwen3-Next: softplus(dt_bias) = dt, log-uniform in [1e-3, 0.1]."""
    dt = torch.exp(
        torch.rand(n, generator=g, device=dev) * (torch.log(torch.tensor(0.1)) - torch.log(torch.tensor(1e-3))).item()
        + torch.log(torch.tensor(1e-3)).item()
    )
    return dt + torch.log(-torch.expm1(-dt))  # inverse softplus


Cases = dict[str, tuple[Callable[[], Any], bool]]  # name -> (callable running the op through `kernels`, uses fla)
Draw = Callable[..., torch.Tensor]  # a random tensor of a shape, scaled, from the cases' one generator


def _cases(a: argparse.Namespace, dt: torch.dtype) -> Cases:
    """name -> (callable running the op through `kernels`, uses fla). Every input is drawn from one seeded
    generator, in this order, so a run's inputs are the same each time."""
    dev = a.device
    g = torch.Generator(device=dev).manual_seed(0)

    def rn(*shape: int, scale: float = 1.0, dtype: torch.dtype = dt) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dtype)

    cases = _norm_cases(a, rn)
    cases["kda(chunked, state)"] = (_kda_case(a, rn, g), True)
    cases["gdn(chunked, state)"] = (_gdn_case(a, rn, g), True)
    cases["mla_attention(chunked, cache)"] = (_mla_case(a, rn), False)
    h, nb = a.hidden, a.bank
    prefix, bank = rn(a.tokens, h), rn(a.tokens, nb, h)
    proj, sn = rn(h, scale=0.05), rn(h, scale=0.1) + 1
    cases["attn_res"] = (lambda: K.attn_res(prefix, bank, proj, sn, 1e-6), False)
    return cases


def _norm_cases(a: argparse.Namespace, rn: Draw) -> Cases:
    """RMS norm (plain and offset), the per-head gated norms, and the chunked short convolution."""
    t, ch = a.tokens, a.chunks
    c = t // ch
    cases: Cases = {}
    h = a.hidden
    x = rn(t, h)
    w = rn(h, scale=0.1) + 1
    cases["rms_norm"] = (lambda: K.rms_norm(x, w, 1e-6), False)
    cases["rms_norm(offset=1)"] = (lambda: K.rms_norm(x, w - 1, 1e-6, 1.0), False)
    n, d = a.kda_heads, a.head_dim
    o = rn(t, n * d)
    gate = rn(t, n * d)
    wn = rn(d, scale=0.1) + 1
    cases["head_rms_norm(sigmoid gate)"] = (lambda: K.head_rms_norm(o, wn, 1e-5, d, gate, "sigmoid"), False)
    cases["head_rms_norm(silu gate)"] = (lambda: K.head_rms_norm(o, wn, 1e-5, d, gate, "silu"), False)
    cases["head_rms_norm(no gate)"] = (lambda: K.head_rms_norm(o, wn, 1e-5, d), False)
    cw = rn(n * d, 1, a.conv_kernel, scale=0.5)
    cases["short_conv(chunked)"] = (_chunked(lambda i, s: K.short_conv(o[i * c : (i + 1) * c], cw, s), ch, True), False)
    return cases


def _kda_case(a: argparse.Namespace, rn: Draw, g: torch.Generator) -> Callable[[], Any]:
    """Kimi delta attention over the chunks, its recurrent state carried (Kimi's A and dt inits)."""
    t, ch, n, d = a.tokens, a.chunks, a.kda_heads, a.head_dim
    c = t // ch
    qk = [rn(t, n * d) for _ in range(3)]
    f = rn(t, n * d, scale=0.5)
    bl = rn(t, n)
    a_log = torch.log(torch.rand(n, generator=g, device=a.device) * 15 + 1)  # Kimi init: A ~ U(1, 16)
    dtb = _dt_bias(n * d, g, a.device)

    def kda_step(i: int, s: dict[str, torch.Tensor] | None) -> torch.Tensor:
        sl = slice(i * c, (i + 1) * c)
        q_, k_, v_ = (z[sl] for z in qk)
        return K.kda(q_, k_, v_, f[sl], bl[sl], head_dim=d, a_log=a_log, dt_bias=dtb, state=s)

    return _chunked(kda_step, ch, True)


def _gdn_case(a: argparse.Namespace, rn: Draw, g: torch.Generator) -> Callable[[], Any]:
    """Gated delta net (Qwen3-Next) over the chunks, its conv and recurrent state carried."""
    t, ch = a.tokens, a.chunks
    c = t // ch
    ng, r, dk, dv = a.gdn_k_heads, a.gdn_v_per_k, 128, 128
    qkvz = rn(t, ng * (2 * dk + 2 * r * dv))
    ba = rn(t, ng * 2 * r)
    gcw = rn(ng * (2 * dk + r * dv), 1, 4, scale=0.5)
    ga = torch.log(torch.rand(ng * r, generator=g, device=a.device) * 15 + 1)
    gdtb = _dt_bias(ng * r, g, a.device)
    gnw = rn(dv, scale=0.1) + 1

    def gdn_step(i: int, s: dict[str, torch.Tensor] | None) -> torch.Tensor:
        sl = slice(i * c, (i + 1) * c)
        return K.gdn(qkvz[sl], ba[sl], conv_weight=gcw, a_log=ga, dt_bias=gdtb, norm_weight=gnw, eps=1e-6,
                     k_head_dim=dk, v_head_dim=dv, v_per_k=r, state=s)  # fmt: skip

    return _chunked(gdn_step, ch, True)


def _mla_case(a: argparse.Namespace, rn: Draw) -> Callable[[], Any]:
    """MLA attention over the chunks, its KV cache carried (unless --mla-no-cache)."""
    t, ch = a.tokens, a.chunks
    c = t // ch
    mh, nope, rope, vd = a.mla_heads, 128, 64, 128
    mq = rn(t, mh * (nope + rope))
    mkv = rn(t, mh * (nope + vd))
    mkr = rn(t, rope)
    pos = torch.arange(t, device=a.device)
    rp = K.Rope(theta=50000.0)

    def mla_step(i: int, s: dict[str, torch.Tensor] | None) -> torch.Tensor:
        sl = slice(i * c, (i + 1) * c)
        return K.mla_attention(mq[sl], mkv[sl], mkr[sl], nope_dim=nope, rope_dim=rope, v_dim=vd, positions=pos[sl],
                               rope=rp, scale=(nope + rope) ** -0.5, cache=s)  # fmt: skip

    return _chunked(mla_step, ch, not a.mla_no_cache)


def check(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Run every case for every dtype; one result row per (op, dtype)."""
    rows: list[dict[str, Any]] = []
    have_fla = fast.fla_available()
    for name_dt in a.dtypes.split(","):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[name_dt]
        cases = _cases(a, dt)
        for name, (fn, needs_fla) in cases.items():
            if a.only and not any(s in name for s in a.only.split(",")):
                continue
            row: dict[str, Any] = {"op": name, "dtype": str(dt).removeprefix("torch.")}
            rows.append(row)
            if needs_fla and not have_fla:
                row["status"] = "fla not importable"
                continue
            try:
                with fast.disabled():
                    want = fn()
                    _sync()
                    row["ref_ms"] = _cuda_ms(fn, a.ref_reps)
                t0 = time.perf_counter()
                out = fn()
                _sync()
                row["first_call_s"] = time.perf_counter() - t0
                for _ in range(a.warmup):
                    fn()
                row["fast_ms"] = _cuda_ms(fn, a.reps)
                row["max_abs"], row["rel"] = _err(out, want)
                tol = (TOL_FLA if needs_fla else TOL)[row["dtype"]]
                row["tol"] = tol
                row["status"] = "ok" if row["rel"] <= tol else "FAIL"
                row["speedup"] = row["ref_ms"] / row["fast_ms"]
                del want, out
            except Exception as e:  # report and carry on: the lead wants the whole table from one run
                row["status"] = f"ERROR {type(e).__name__}: {e}"[:300]
                row["traceback"] = traceback.format_exc()[-2000:]
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


def _table(rows: list[dict[str, Any]], have_fla: bool, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"tpplan fast kernels vs reference (fla {'ok' if have_fla else 'not importable'}), {wall:.1f} s")
    for col in ("op", "dtype", "status", "max_abs", "rel", "ref ms", "fast ms", "speedup", "1st call s"):
        tab.add_column(col, justify="left" if col in ("op", "dtype", "status") else "right")

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in rows:
        tab.add_row(
            r["op"],
            r["dtype"],
            r.get("status", "?"),
            fmt(r.get("max_abs"), ".2e"),
            fmt(r.get("rel"), ".2e"),
            fmt(r.get("ref_ms"), ".3f"),
            fmt(r.get("fast_ms"), ".3f"),
            fmt(r.get("speedup"), ".1f"),
            fmt(r.get("first_call_s"), ".2f"),
        )
    Console(width=160).print(tab)
    for r in rows:
        if "traceback" in r:
            print(f"--- {r['op']} {r['dtype']}:\n{r['traceback']}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry: print the table, write JSON if asked, exit 1 on any failure or error."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunks", type=int, default=2, help="chunks of tokens/chunks with carried state")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--kda-heads", type=int, default=48, help="KDA heads per rank (K3: 96 over TP2)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--conv-kernel", type=int, default=4)
    p.add_argument("--gdn-k-heads", type=int, default=8, help="GDN key heads per rank (Qwen3-Next: 16 over TP2)")
    p.add_argument("--gdn-v-per-k", type=int, default=2)
    p.add_argument("--mla-heads", type=int, default=48, help="MLA heads per rank (K3: 96 over TP2)")
    p.add_argument("--mla-no-cache", action="store_true")
    p.add_argument("--bank", type=int, default=8, help="K3 attn_res bank snapshots")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--only", default="", help="comma list of op-name substrings")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--ref-reps", type=int, default=2)
    p.add_argument("--json", default="")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the harness (fast paths forced)")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("fast_check needs CUDA (or --device cpu for a smoke run)")
        return 2
    t0 = time.perf_counter()
    have_fla = fast.fla_available()
    with fast.forced() if a.device == "cpu" else contextlib.nullcontext():
        rows = check(a)
    wall = time.perf_counter() - t0
    _table(rows, have_fla, wall)
    if a.json:
        meta = {
            "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "fla": have_fla,
            "wall_s": wall,
            "args": vars(a),
        }
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    return 0 if all(r.get("status") in ("ok", "fla not importable") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
