"""Time one collective on a torch.distributed group, as nccl-tests does.

Shared by `calibrate` and `collective_check` (the group itself is formed by
`tpplan.runtime.group.run_group`). torch is imported inside the functions so that importing this
module stays cheap.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def make_op(kind: str, count: int, world: int, rank: int, dtype: Any, device: Any
            ) -> Callable[[], None]:  # fmt: skip
    """A closure running one collective whose nccl-tests size is `count` elements."""
    import torch
    import torch.distributed as dist

    if count % world:
        raise ValueError(f"count {count} not divisible by world {world}")
    full = torch.ones(count, dtype=dtype, device=device)
    part = torch.ones(count // world, dtype=dtype, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "reduce_scatter":
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: rs(part, full)
    if kind == "all_gather":
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: ag(full, part)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if kind == "send_recv":
        recv = torch.empty_like(full)

        def sendrecv() -> None:
            ops = [
                dist.P2POp(dist.isend, full, (rank + 1) % world),
                dist.P2POp(dist.irecv, recv, (rank - 1) % world),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return sendrecv
    raise ValueError(f"unknown collective {kind}")


def time_op(op: Callable[[], None], device: Any, iters: int, warmup: int, reps: int = 5) -> float:
    """Seconds of one call: the fastest of `reps` batch means, the slowest rank's (MAX across the group).

    GPU: as nccl-tests does, one pair of CUDA events around `iters` back-to-back calls after a
    barrier, divided by `iters`. Events around single calls also time the host's launch and the
    ranks' skew (seen on 2xH200: +30 us on 2 MB messages), which a serving engine's stream of
    back-to-back collectives does not pay. The fastest batch, not the median: on a shared host a
    whole batch is sometimes slowed 2-3x by a neighbour (seen: 417 us for a 160 us all-gather),
    and the model predicts the uncontended time. CPU: barrier, then perf_counter around each
    call, median.
    """
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        op()
    times = []
    if device.type == "cuda":
        for _ in range(reps):
            torch.cuda.synchronize(device)
            dist.barrier()
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                op()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters)
    else:
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
    best = min(times) if device.type == "cuda" else statistics.median(times)
    med = torch.tensor([best], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return float(med.item())
