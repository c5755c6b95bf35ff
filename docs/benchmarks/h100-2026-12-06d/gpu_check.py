"""Checks on the GPU before the timed runs: the new kernels equal the references in bf16 (relative error).

2026-12-06d (issue 34): the 06c checks, then fla's window kernel (`masked_attention.fla_window_attention`,
the bench's window kernel on CUDA) at Gemma 3's and gpt-oss's head dims and windows, with and without a
cache before the chunk, against the fp32 reference, and the name `serving_attention` records for it.
`python3 gpu_check.py cuda` (run.sh passes it); an "error" line means a check raised."""
import sys
import torch
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
dt = torch.bfloat16 if dev == "cuda" else torch.float32
from tpplan.bench import masked_attention as MA, decode_sweep as D, serving_kernels as SK
from tpplan.runtime import kernels_attention as KA
from tpplan.runtime import fast_kernels as RF
torch.manual_seed(0)
def rel(a, b): return float((a.double() - b.double()).norm() / b.double().norm())
def qkv(t, s, n, d, dv=None):
    return (torch.randn(t, n, d, device=dev, dtype=dt), torch.randn(s, n, d, device=dev, dtype=dt),
            torch.randn(s, n, dv or d, device=dev, dtype=dt))
def ref(q, k, v, *a, **kw):
    with RF.disabled():
        return KA.causal_attention(q.float(), k.float(), v.float(), *a, **kw)
out = {}
try:
    q, k, v = qkv(512, 1536, 8, 64)
    sinks = torch.randn(8, device=dev)
    out["window128"] = rel(MA.windowed_attention(q, k, v, 0.125, 128), ref(q, k, v, 0.125, window=128))
    out["window128+sinks"] = rel(MA.windowed_attention(q, k, v, 0.125, 128, sinks), ref(q, k, v, 0.125, window=128, sinks=sinks))
    out["window1024"] = rel(MA.windowed_attention(q, k, v, 0.125, 1024), ref(q, k, v, 0.125, window=1024))
    out["banded128+sinks"] = rel(MA.banded_attention(q, k, v, 0.125, 128, sinks), ref(q, k, v, 0.125, window=128, sinks=sinks))
    out["banded1024"] = rel(MA.banded_attention(q, k, v, 0.125, 1024), ref(q, k, v, 0.125, window=1024))
    out["sinks"] = rel(MA.sink_attention(q, k, v, 0.125, sinks), ref(q, k, v, 0.125, sinks=sinks))
    out["chunk512"] = rel(MA.chunked_attention(q, k, v, 0.125, 512, RF.causal_attention), ref(q, k, v, 0.125, chunk=512))
    keep = torch.rand(512, 1536, device=dev) > 0.5
    # fla's window kernel (bf16) against the fp32 reference: gpt-oss (64 heads of 64 here 8, window 128, sinks),
    # Gemma 3 (head dim 256, window 1024); "cache" = the chunk after cached keys (k cut, q front-padded).
    for label, (t, s, n, d, w, snk) in {"gptoss w128+sinks": (512, 512, 8, 64, 128, True),
                                        "gptoss w128+sinks cache": (512, 1536, 8, 64, 128, True),
                                        "gemma3 w1024": (2048, 2048, 4, 256, 1024, False),
                                        "gemma3 w1024 cache": (1024, 3072, 4, 256, 1024, False)}.items():
        if MA.fla_parallel_attn() is None:
            out["fla window"] = "fla.ops.attn.parallel does not import here: not checked"
            break
        q3, k3, v3 = qkv(t, s, n, d)
        sk = torch.randn(n, device=dev) if snk else None
        want = ref(q3, k3, v3, d**-0.5, window=w, sinks=sk)
        out[f"fla window {label}"] = rel(MA.fla_window_attention(q3, k3, v3, d**-0.5, w, sk), want)
        out[f"serving window {label} ran"] = SK.serving_attention(q3, k3, v3, d**-0.5, w, None, sk)[0]
    out["reference-blocks(topk)"] = rel(KA.causal_attention(q, k, v, 0.125, keep), ref(q, k, v, 0.125, keep))
    b, n, hk = 4, 4096, 2
    q2 = torch.randn(b, 16, 128, device=dev, dtype=dt)
    k2, v2 = torch.randn(b, n, hk, 128, device=dev, dtype=dt), torch.randn(b, n, hk, 128, device=dev, dtype=dt)
    r = torch.softmax(torch.einsum("bhd,blhd->bhl", q2.double(), k2.double().repeat_interleave(8, 2)) * 0.09, -1)
    want = torch.einsum("bhl,blhd->bhd", r, v2.double().repeat_interleave(8, 2))
    for s in (1, 4, 16):
        out[f"decode_gqa splits={s}"] = rel(D.decode_attention(q2, k2, v2, 0.09, s), want)
    lat = torch.randn(b, n, 1, 576, device=dev, dtype=dt)
    qm = torch.randn(b, 32, 576, device=dev, dtype=dt)
    r = torch.softmax(torch.einsum("bhd,bld->bhl", qm.double(), lat[:, :, 0].double()) * 0.07, -1)
    want = torch.einsum("bhl,bld->bhd", r, lat[:, :, 0, :512].double())
    for s in (1, 8):
        out[f"decode_mla splits={s}"] = rel(D.decode_attention(qm, lat, lat[..., :512], 0.07, s), want)
    SK.reset_expert_paths()
    for inter in (90, 96):
        xs = torch.randn(64, 256, device=dev, dtype=dt)
        counts = torch.full((4,), 16, device=dev, dtype=torch.int64)
        w = [torch.randn(4, inter, 256, device=dev, dtype=dt) * 0.02, torch.randn(4, inter, 256, device=dev, dtype=dt) * 0.02,
             torch.randn(4, 256, inter, device=dev, dtype=dt) * 0.02]
        SK.expert_ffn(xs, counts, *w)
        out[f"grouped inter={inter}"] = SK.grouped_gemm_used()
        SK.reset_expert_paths()
    out["refused"] = SK.refused_expert_shapes()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
for k_, v_ in out.items():
    print(f"check {k_}: {v_}")
