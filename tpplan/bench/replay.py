"""Collective replays and the ranks' combination for `tpplan bench`.

Every distinct collective of the first timed pass is replayed in a tight loop twice, on tensors
of the same shapes: through the runtime's `Comm` method (`runtime_s`) and as the bare
torch.distributed call (`direct_s`), timed as `tpplan calibrate` times (events around a batch of
back-to-back calls, fastest of 3 batches): their ratio is the runtime's overhead.

Combining ranks: ops, layers and batches take the slowest rank (a step ends when its slowest
rank does). A collective takes the fastest rank: it ends at the same moment on every rank, so the
rank that arrived last measures the collective itself and the others add their wait for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpplan.bench.config import BenchConfig
from tpplan.bench.probe import Clock, Span


def replay_collectives(
    recs: list[Span], rank: int, world: int, device: Any, cfg: BenchConfig, clock: Clock
) -> dict[int, Any]:
    """Each distinct collective of the first pass, replayed through `Comm` and directly; per-call seconds."""
    import torch
    import torch.distributed as dist

    from tpplan.runtime.distributed import make_comm

    colls = [(i, r) for i, r in enumerate(recs) if r.kind == "coll" and r.meta.get("call") is not None]
    # Distinct by what rank 0 sees; every rank replays its own call at the same position.
    keys: dict[tuple[Any, ...], int] = {}
    for i, r in colls:
        keys.setdefault(replay_key(r), i)
    chosen = [sorted(keys.values())]
    dist.broadcast_object_list(chosen, src=0)
    out: dict[int, Any] = {}
    fresh = make_comm(rank, world)
    for i in chosen[0]:
        r = recs[i]
        method, args, kw = r.meta["method"], r.meta["args"], r.meta["kw"]
        real = [torch.zeros(a[1], dtype=getattr(torch, a[2]), device=device) if _is_t(a) else a for a in args]

        def via_comm(_m: str = method, _real: list[Any] = real, _kw: dict[str, Any] = kw) -> None:
            getattr(fresh, _m)(*_real, **_kw)
            fresh.tracer.calls.clear()

        direct = _direct_call(method, real, r.meta["call"], world)
        out[i] = (_time_loop(via_comm, clock, cfg), _time_loop(direct, clock, cfg))
    return out


def replay_key(r: Span) -> tuple[Any, ...]:
    """Calls with the same method and argument shapes are the same collective (the value name aside)."""
    return (r.meta["method"], tuple(a for a in r.meta["args"] if not isinstance(a, str)))


def _direct_call(method: str, real: list[Any], call: Any, n: int) -> Callable[[], Any]:
    """The bare torch.distributed call that `Comm.<method>` makes, on preallocated buffers."""
    import torch
    import torch.distributed as dist

    from tpplan.runtime.trace import _AG, _RS, pad_rows

    x = real[0]
    if method == "all_reduce":
        buf = x.clone()
        return lambda: dist.all_reduce(buf)
    if method == "reduce_scatter":
        per = -(-int(real[2]) // n)
        full = pad_rows(x, per * n).contiguous()
        part = full.new_empty(per, *full.shape[1:])
        return lambda: _RS(part, full)
    if method in ("all_gather_tokens", "all_gather_heads"):
        src = x.contiguous()
        dst = x.new_empty(x.shape[0] * n, *x.shape[1:])
        return lambda: _AG(dst, src)
    if method == "tokens_to_heads":
        send = x.new_zeros(call.bytes // x.element_size())
        recv = torch.empty_like(send)
        return lambda: dist.all_to_all_single(recv, send)
    if method == "all_to_all_rows":
        send_rows, recv_rows = list(real[1]), list(real[2])
        out = x.new_empty(sum(recv_rows), *x.shape[1:])
        return lambda: dist.all_to_all_single(out, x, recv_rows, send_rows)
    if method == "exchange_counts":
        got = torch.empty_like(x)
        return lambda: dist.all_to_all_single(got, x)
    raise RuntimeError(f"no direct form for {method}")


def _is_t(a: Any) -> bool:
    return isinstance(a, tuple) and len(a) == 3 and a[0] == "tensor"


def _time_loop(fn: Callable[[], Any], clock: Clock, cfg: BenchConfig, reps: int = 3) -> float:
    """Seconds per call, nccl-tests style (as `tpplan calibrate` measured the model's constants):
    one interval around `direct_iters` back-to-back calls divided by their number, the fastest of
    `reps` such batches, after 3 warm-up calls and a barrier."""
    import torch.distributed as dist

    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        clock.sync()
        dist.barrier()
        a = clock.mark()
        for _ in range(cfg.direct_iters):
            fn()
        b = clock.mark()
        clock.sync()
        best = min(best, clock.seconds(a, b) / cfg.direct_iters)
    return best


def combine(
    records: list[list[Span]], gathered: list[Any], trace0: list[Any], fallbacks: list[str], plan: Any
) -> dict[str, Any]:
    """Rank 0: per interval, the slowest rank (collectives: the fastest), listed over the passes.

    Every pass runs the same batches through the same code, so the n-th interval of one pass is
    the n-th of every other pass and of every rank."""
    iters = len(records)
    sites: list[dict[str, Any]] = []
    for pos, r in enumerate(records[0]):
        entry: dict[str, Any] = {
            "kind": r.kind,
            "batch": r.batch,
            "seg": r.seg,
            "layer": r.layer,
            "name": r.name,
            "pos": pos,
            "seconds": [],
            "comm_s": [],
        }
        for it in range(iters):
            secs = [g[0][it][pos] for g in gathered]
            if r.kind == "coll":
                entry["seconds"].append(min(secs))
                entry["comm_s"].append(0.0)
            else:
                k = max(range(len(secs)), key=lambda j: secs[j])
                entry["seconds"].append(secs[k])
                entry["comm_s"].append(gathered[k][1][it][pos])
        if r.kind == "coll":
            call = r.meta.get("call")
            if call is None:  # one rank: nothing moved
                entry["kind"] = "none"
                sites.append(entry)
                continue
            entry.update(
                method=r.meta["method"],
                value=call.value,
                coll=call.kind,
                shape=tuple(call.shape),
                dtype=call.dtype,
                bytes=call.bytes,
                planned=call.planned,
            )
        sites.append(entry)
    replay = {pos: (min(g[2][pos][0] for g in gathered), min(g[2][pos][1] for g in gathered)) for pos in gathered[0][2]}
    by_key = {replay_key(records[0][pos]): v for pos, v in replay.items()}
    for entry in sites:
        if entry["kind"] == "coll":
            entry["replay"] = by_key.get(replay_key(records[0][entry["pos"]]))
    return {"sites": sites, "replay": replay, "trace": trace0, "fallbacks": fallbacks, "iters": iters, "plan": plan}
