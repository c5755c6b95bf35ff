"""The engines' two-micro-batch order run for real on one GPU, against the cost model's simulation.

`tpplan.cost.overlap.two_microbatch_seconds` prices SGLang's two-batch overlap (and vLLM's
dual-batch overlap) by simulating the order the engines run: stage k of micro-batch A, then stage k
of B, layer after layer, on one compute stream; each MoE layer's dispatch and combine all-to-alls
on the communication SMs in launch order; a stage that needs its all-to-all waits for it. This
replays that order on one GPU with real kernels: a MoE layer's half-batch ops at DeepSeek-V3's
widths on the compute stream, and each all-to-all as a kernel that holds 20 SMs for a set time
(`tpplan.bench.sm_load`, paced at 100 GB/s, as DeepEP holds its SMs), launched on a second stream
when the compute stream reaches it, with events for every wait. It then compares the measured
time with:

- `model`: the simulation with the cost model's own slowdowns (`OverlapCosts` defaults);
- `schedule`: the simulation with each op's slowdown measured beside the held load in this run
  (isolates the schedule's error from the slowdowns');
- `perfect`: max(compute, all-to-all), what "overlap is free" would say;
- the same ops and all-to-alls run one after another (no overlap), measured and summed.

Run on a GPU machine:
    python -m tpplan.bench.overlap_replay --out replay.json
Nothing crosses a link here: the all-to-all is a stand-in of a set duration, so this checks the
schedule and the on-GPU contention, not the network.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpplan.cost.overlap import OverlapCosts

Ops = list[tuple[str, str, Callable[[], Any]]]  # (name, cost-model category, one call)
STAGES = ("pre", "experts", "shared", "post")
REPS = 20  # calls per timed batch of one op


def _half_layer(torch: Any, tokens: int) -> dict[str, Ops]:
    """One half-batch of a DeepSeek-V3-like MoE layer per rank (hidden 7168), by engine stage."""
    dev, bf = "cuda", torch.bfloat16
    r = torch.randn
    x = r(tokens, 7168, device=dev, dtype=bf)
    w_qkv, w_o = r(7168, 3072, device=dev, dtype=bf), r(2048, 7168, device=dev, dtype=bf)
    q, k, v = (r(1, 16, tokens, 128, device=dev, dtype=bf) for _ in range(3))
    attn_out = r(tokens, 2048, device=dev, dtype=bf)
    experts_in = r(8, tokens * 8 // 32, 7168, device=dev, dtype=bf)  # 8 local experts, top-8 of 256 over EP32
    w_e = r(8, 7168, 2048, device=dev, dtype=bf)
    w_su, w_sd = r(7168, 4096, device=dev, dtype=bf), r(2048, 7168, device=dev, dtype=bf)
    sh_mid = r(tokens, 2048, device=dev, dtype=bf)
    w = r(7168, device=dev, dtype=bf)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def norm() -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf) * w

    return {
        "pre": [
            ("rmsnorm", "elementwise", norm),
            ("qkv", "gemm", lambda: x @ w_qkv),
            ("attention", "attention", lambda: sdpa(q, k, v, is_causal=True)),
            ("o_proj", "gemm", lambda: attn_out @ w_o),
            ("router_norm", "elementwise", norm),
        ],
        "experts": [("experts", "moe", lambda: torch.bmm(experts_in, w_e))],
        "shared": [("shared_up", "gemm", lambda: x @ w_su), ("shared_down", "gemm", lambda: sh_mid @ w_sd)],
        "post": [("residual", "elementwise", lambda: x.add(x))],
    }


def _run(
    torch: Any, layers: list[tuple[dict[str, Ops], dict[str, Ops]]], comm: Callable[[], Any], overlap: bool
) -> float:
    """Seconds for the layers' two micro-batches, in the engines' order (`overlap`) or one after another."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    landed: dict[str, Any] = {}

    def compute(ops: Ops) -> None:
        for _, _, fn in ops:
            fn()

    def launch(key: str) -> None:
        if not overlap:
            comm()
            return
        side.wait_stream(main)
        with torch.cuda.stream(side):
            comm()
            landed[key] = torch.cuda.Event()
            landed[key].record(side)

    def wait(key: str) -> None:
        if overlap:
            main.wait_event(landed[key])

    def stages(mbs: list[dict[str, Ops]], tag: str) -> list[list[Callable[[], None]]]:
        """One micro-batch's stages over the layers, cut as `cost.overlap._stages` cuts them: [pre,
        launch dispatch], [wait, experts, launch combine], [shared, wait, post, next pre, launch]."""
        out: list[list[Callable[[], None]]] = [[]]
        for i, mb in enumerate(mbs):
            d, c = f"{tag}{i}d", f"{tag}{i}c"
            out[-1] += [partial(compute, mb["pre"]), partial(launch, d)]
            out.append([partial(wait, d), partial(compute, mb["experts"]), partial(launch, c)])
            out.append([partial(compute, mb["shared"]), partial(wait, c), partial(compute, mb["post"])])
        return out

    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(main)
    sa, sb = stages([a for a, _ in layers], "a"), stages([b for _, b in layers], "b")
    order = [st for pair in zip(sa, sb, strict=True) for st in pair] if overlap else sa + sb
    for stage in order:  # overlap: stage k of A, then stage k of B (the engines' order)
        for step in stage:
            step()
    e1.record(main)
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / 1e3


def ops_table(half: dict[str, Ops], alone: dict[str, float], slowdown: dict[str, float]) -> list[dict[str, Any]]:
    """The measured ops, by stage: what `predict` needs (and what the JSON keeps)."""
    return [
        {"stage": st, "op": n, "category": c, "alone_s": alone[n], "beside_held_slowdown": slowdown[n]}
        for st in STAGES
        for n, c, _ in half[st]
    ]


def predict(ops: list[dict[str, Any]], comm_s: float, layers: int, costs: Any) -> dict[str, float]:
    """The cost model's simulation of the replayed layers, from the measured ops (also run on the
    shipped files by tests/cost/test_overlap.py): `model` with the cost model's slowdowns, `schedule`
    with each op's own measured slowdown, and the perfect-overlap and summed-serial bounds."""
    from tpplan.cost.overlap import MoeStages, Work, two_microbatch_seconds

    def stages(factor: Callable[[dict[str, Any]], float]) -> MoeStages:
        def work(stage: str) -> Work:
            mine = [o for o in ops if o["stage"] == stage]
            return Work(sum(o["alone_s"] for o in mine), sum(o["alone_s"] * factor(o) for o in mine))

        a2a = comm_s * costs.comm
        return MoeStages(work("pre"), a2a, work("experts"), a2a, work("shared"), work("post"))

    compute = sum(o["alone_s"] for o in ops)
    model = stages(lambda o: costs.factor(o["category"]))
    sched = stages(lambda o: o["beside_held_slowdown"])
    return {
        "comm_over_compute": 2 * comm_s / compute,
        "model_s": two_microbatch_seconds([model] * layers, [model] * layers),
        "schedule_s": two_microbatch_seconds([sched] * layers, [sched] * layers),
        "perfect_s": max(2 * layers * compute, 4 * layers * comm_s),
        "summed_serial_s": 2 * layers * (compute + 2 * comm_s),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args(argv)
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file, write_files

    try:
        out = check_file("--out", args.out)
    except TpplanError as e:
        print(e, file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("overlap_replay: no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    from tpplan.cost.overlap import OverlapCosts

    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    costs = OverlapCosts(sm_count=sm_count, comm_sms=20)
    half = _half_layer(torch, args.tokens)
    alone, slowdown = _time_ops(torch, half, costs)
    rows = _replay_rows(torch, half, alone, slowdown, args.layers, costs)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sm_count": sm_count,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens_per_micro_batch": args.tokens,
            "layers": args.layers}  # fmt: skip
    ops = ops_table(half, alone, slowdown)
    write_files({out: json.dumps({"meta": meta, "ops": ops, "rows": rows}, indent=1) + "\n"}, "--out")
    return 0


def _time_ops(torch: Any, half: Any, costs: OverlapCosts) -> tuple[dict[str, float], dict[str, float]]:
    """Each op of the half layer timed alone (after a warm-up), and its slowdown beside 20 held SMs (the
    held load running the whole window, median of 3), printed beside the model's factor."""
    from tpplan.bench.overlap_probe import time_beside, time_calls
    from tpplan.bench.sm_load import sm_load

    every = [op for s in STAGES for op in half[s]]
    for _ in range(300):
        for _, _, fn in every:
            fn()
    torch.cuda.synchronize()
    held, _, _ = sm_load(torch, 20, 100e9, call_s=0.004)
    held_s = time_calls(torch, held, 5, batches=5)
    alone = {name: time_calls(torch, fn, REPS, batches=5) for name, _, fn in every}
    slowdown = {  # the op timed while the held load runs the whole window, median of 3
        name: statistics.median(time_beside(torch, fn, REPS, held, held_s, REPS * alone[name])[0] for _ in range(3))
        / alone[name]
        for name, _, fn in every
    }
    for name, cat, _ in every:
        print(f"{name:12s} {cat:11s} {alone[name] * 1e3:7.3f} ms  x{slowdown[name]:.2f} beside 20 held SMs "
              f"(model x{costs.factor(cat):.2f})", file=sys.stderr)  # fmt: skip
    return alone, slowdown


def _replay_rows(
    torch: Any, half: Any, alone: dict[str, float], slowdown: dict[str, float], layers: int, costs: OverlapCosts
) -> list[dict[str, float]]:
    """Two micro-batches of `layers` layers replayed with and without overlap, at five all-to-all/compute
    ratios, each beside the model's and the schedule's prediction."""
    from tpplan.bench.overlap_probe import time_calls
    from tpplan.bench.sm_load import sm_load

    compute_s = sum(alone.values())
    rows = []
    for ratio in (0.25, 0.5, 1.0, 1.5, 2.5):
        # each all-to-all lasts `ratio` x a quarter of the layer's compute (two all-to-alls per half)
        comm_target = ratio * compute_s / 4
        comm, _, _ = sm_load(torch, 20, 100e9, call_s=comm_target)
        comm_s = time_calls(torch, comm, 10, batches=5)
        stack = [(half, half)] * layers
        measured = statistics.median(_run(torch, stack, comm, True) for _ in range(5))
        serial = statistics.median(_run(torch, stack, comm, False) for _ in range(5))
        row = {"comm_s": comm_s, "measured_overlap_s": measured, "measured_serial_s": serial}
        row.update(predict(ops_table(half, alone, slowdown), comm_s, layers, costs))
        rows.append(row)
        print(f"a2a/compute {row['comm_over_compute']:.2f}: measured {measured * 1e3:.2f} ms (serial "
              f"{serial * 1e3:.2f}); model {row['model_s'] * 1e3:.2f}, schedule {row['schedule_s'] * 1e3:.2f}, "
              f"perfect {row['perfect_s'] * 1e3:.2f}", file=sys.stderr, flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
