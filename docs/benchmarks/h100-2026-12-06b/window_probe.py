"""Sliding-window attention at the bench's shapes, three ways (run from the repository root):
the bench's `windowed_attention` (flash per block of window-1 queries, two calls merged by log-sum-exp),
its `banded_attention` (one SDPA call with a band mask) and torch's FlexAttention with a block mask
(compiled; skips the blocks outside the window). Prints ms per call (CUDA events, median of 20) and the
relative error against the fp32 reference on a small shape. `python window_probe.py [cpu]`."""
import statistics
import sys
import time

import torch

from tpplan.bench import masked_attention as MA
from tpplan.runtime import fast_kernels as RF
from tpplan.runtime import kernels_attention as KA

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
dt = torch.bfloat16 if dev == "cuda" else torch.float32


def flex_window(q, k, v, scale, window, compiled):
    from torch.nn.attention.flex_attention import create_block_mask

    t, s = q.shape[0], k.shape[0]
    off = s - t

    def mask(b, h, qi, ki):
        return (ki <= qi + off) & (ki > qi + off - window)

    bm = create_block_mask(mask, None, None, t, s, device=q.device)
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    return compiled(qh, kh, vh, block_mask=bm, scale=scale)[0].transpose(0, 1).reshape(t, -1)


def timed(fn, reps=20):
    fn()
    if dev != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

compiled = torch.compile(flex_attention, dynamic=False) if dev == "cuda" else flex_attention
small = [(256, 512, 4, 64, 64), (8192, 16384, 8, 256, 1024), (8192, 16384, 64, 64, 128)]
shapes = small[:1] if dev != "cuda" else small
for t, s, n, d, w in shapes:
    q, k, v = (torch.randn(x, n, d, device=dev, dtype=dt) for x in (t, s, s))
    sc = d**-0.5
    row = {"shape": f"T{t} S{s} heads{n} d{d} window{w}"}
    for name, fn in (("flash blocks", lambda: MA.windowed_attention(q, k, v, sc, w)),
                     ("band mask", lambda: MA.banded_attention(q, k, v, sc, w)),
                     ("flex", lambda: flex_window(q, k, v, sc, w, compiled))):
        try:
            t0 = time.perf_counter()
            out = fn()
            first = time.perf_counter() - t0
            row[name] = f"{timed(fn):.3f} ms (first call {first:.1f} s)"
            if t <= 256:
                with RF.disabled():
                    ref = KA.causal_attention(q.float(), k.float(), v.float(), sc, window=w)
                row[name] += f", rel err {float((out.float() - ref).norm() / ref.norm()):.1e}"
        except Exception as exc:  # a way that fails is reported, the others still run
            row[name] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
    print(row, flush=True)
