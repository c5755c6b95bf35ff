"""Checks on the GPU before the timed runs of call E (2026-12-06e, issue 34): the engines' own kernels
(`tpplan.bench.engine_kernels`: vLLM 0.34.0's FA3 and sgl-flash-mla 1.0.0's FlashMLA, from $TPPLAN_ENGINE_KERNELS,
which run.sh unpacks) load on this torch, and equal the fp32 reference at small shapes.

One line per check, printed as it is made (a check cut off by the time limit keeps the lines before it):
"loaded" / "refused (why)" for each library, then per engine kernel and shape the relative error
||got - ref|| / ||ref|| and the largest absolute error against the fp32 reference, PASS where the relative error
is at most 2e-2 (bf16 inputs and output, 8 bits of mantissa: about 4e-3 relative per element, with fp32
accumulation in the kernels), and ms per call (CUDA events, 5 calls after a warm-up). The bench's own kernels at
the same shapes are timed last (fla's and Triton's builds take the longest). `python3 gpu_check.py cuda` (run.sh
passes it); an "error" line means a check raised. On a CPU every engine line says "refused (no CUDA device)"."""
import os
import sys
import torch
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
dt = torch.bfloat16
from tpplan.bench import engine_kernels as EK, gpu_kernels as GK, serving_kernels as SK, decode_sweep as D
from tpplan.runtime import kernels_attention as KA
from tpplan.runtime import fast_kernels as RF
torch.manual_seed(0)
TOL = 2e-2
def errs(a, b):
    d = (a.double() - b.double())
    r = float(d.norm() / b.double().norm())
    return f"rel {r:.2e}, max abs {float(d.abs().max()):.2e} ({'PASS' if r <= TOL else 'FAIL'} at {TOL:g})"
def ref(q, k, v, *a, **kw):
    with RF.disabled():
        return KA.causal_attention(q.float(), k.float(), v.float(), *a, **kw)
def ms(fn):
    if dev != "cuda":
        return None
    fn()
    a_, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a_.record()
    for _ in range(5):
        fn()
    b_.record()
    torch.cuda.synchronize()
    return round(a_.elapsed_time(b_) / 5, 3)
def randn(*s):
    return torch.randn(*s, device=dev, dtype=dt)
class Out(dict):
    """Each check printed as soon as it is made: a check cut off by the time limit keeps the lines before it."""
    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        print(f"check {k}: {v}", flush=True)
out = Out()
own_later = []  # the bench's own kernels at the same shapes, timed last (fla's and Triton's builds take the longest)
print("torch", torch.__version__, "engine folder", os.environ.get(EK.ENV))
out["FA3"] = "loaded" if EK.fa3_loaded() else f"refused ({EK.refusals().get('FA3')})"
out["FlashMLA"] = "loaded" if EK.flashmla_loaded() else f"refused ({EK.refusals().get('FlashMLA')})"
# FA3: gpt-oss (64-wide heads, window 128, sinks, GQA 8:1), Gemma 3 (256-wide heads, window 1024, GQA 2:1),
# Llama 4 (128-wide heads, chunks; 512 here, 8192 in the model), sinks alone; with and without cached keys.
for label, (t, s, n, kvh, d, w, ch, snk) in {
        "gptoss w128+sinks 8h/1kv": (512, 512, 8, 1, 64, 128, None, True),
        "gptoss w128+sinks 8h/1kv cache": (512, 1536, 8, 1, 64, 128, None, True),
        "gemma3 w1024 4h/2kv": (2048, 2048, 4, 2, 256, 1024, None, False),
        "gemma3 w1024 4h/2kv cache": (1024, 3072, 4, 2, 256, 1024, None, False),
        "llama4 chunk512 8h/2kv": (1024, 1024, 8, 2, 128, None, 512, False),
        "llama4 chunk512 8h/2kv cache": (1024, 1664, 8, 2, 128, None, 512, False),
        "sinks only 8h/8kv cache": (512, 1024, 8, 8, 64, None, None, True)}.items():
    if not EK.fa3_loaded():
        break
    try:
        q, k, v = randn(t, n, d), randn(s, kvh, d), randn(s, kvh, d)
        sk = torch.randn(n, device=dev) if snk else None
        want = ref(q, *KA.repeat_kv(k, v, n), d**-0.5, window=w, chunk=ch, sinks=sk)
        got = EK.fa3_attention(q, k, v, d**-0.5, w, sk, ch)
        name = SK.serving_attention(q, k, v, d**-0.5, w, ch, sk)[0]
        times = {"FA3": ms(lambda: EK.fa3_attention(q, k, v, d**-0.5, w, sk, ch))}
        out[f"FA3 {label}"] = f"{errs(got, want)}; serving_attention ran: {name[:60]}; ms {times}"
        own_later.append((label, q, k, v, d, n, w, ch, sk))
    except Exception as exc:
        out[f"FA3 {label}"] = f"error {type(exc).__name__}: {exc}"[:400]
# FlashMLA sparse prefill in the absorbed form (DeepSeek-V3.2 / GLM-5.1: 576/512), 512 queries after 3584 cached
# keys, top-k 2048 distinct earlier keys (a query with fewer gets later ones, -1 here): 128 heads (TP1), 64 and 16
# (padded to 64 as vLLM does). The reference: fp32 attention over all keys, all but the selected masked.
for h in (128, 64, 16):
    if not EK.flashmla_loaded():
        break
    try:
        t, s_all, topk = 512, 4096, 2048
        q4, kv = randn(t, h, 576), randn(s_all, 1, 576)
        pos = torch.arange(s_all - t, s_all, device=dev)
        later = torch.arange(s_all, device=dev)[None] > pos[:, None]
        idx = torch.rand(t, s_all, device=dev).masked_fill(later, -1).topk(topk, dim=1).indices
        idx = idx.masked_fill(idx > pos[:, None], -1).to(torch.int32)
        sc = 576**-0.5
        keep = KA.index_mask(idx.clamp(min=0).long(), s_all) & ~later
        want = ref(q4, kv.expand(-1, h, -1), kv[..., :512].expand(-1, h, -1), sc, keep).reshape(t, h, 512)
        got = EK.flashmla_sparse(q4, kv, idx.reshape(t, 1, topk), sc)
        times = {"FlashMLA": ms(lambda: EK.flashmla_sparse(q4, kv, idx.reshape(t, 1, topk), sc))}
        out[f"FlashMLA sparse {h}h latent"] = f"{errs(got, want)}; ms {times}"
    except Exception as exc:
        out[f"FlashMLA sparse {h}h latent"] = f"error {type(exc).__name__}: {exc}"[:400]
# The bench's DSA path with the runtime's per-head layout (DeepSeek-V3.2: heads of 192/128; 128 at TP1, 16 at TP8):
# what runs, that the output has the layer's shape (timing form: not the layer's values, see
# engine_kernels.absorbed_form), and ms of the whole path (the conversion to the absorbed form included) beside
# FlashMLA alone on the converted inputs: what the conversion adds to the bench's op time.
for h in (128, 16):
    if not EK.flashmla_loaded():
        break
    try:
        t, s_all = 2048, 8192
        qh, kh, vh = randn(t, h, 192), randn(s_all, h, 192), randn(s_all, h, 128)
        idx = torch.randint(0, s_all - t, (t, 2048), device=dev)
        got = GK.try_engine_sparse(qh, kh, vh, 192**-0.5, idx)
        conv = EK.absorbed_form(qh, kh, idx)
        times = {"bench path": ms(lambda: GK.try_engine_sparse(qh, kh, vh, 192**-0.5, idx)),
                 "FlashMLA alone": ms(lambda: EK.flashmla_sparse(*conv, 192**-0.5))}
        out[f"bench DSA per-head {h}h"] = ("not run" if got is None else
                                          f"{got[0][:60]}...; out {tuple(got[1].shape)}; ms {times}")
    except Exception as exc:
        out[f"bench DSA per-head {h}h"] = f"error {type(exc).__name__}: {exc}"[:400]
# FlashMLA dense bf16 decode: one new token per request over a 4096-key latent cache, 4 requests, 16 / 64 / 128 heads;
# the reference in fp64; ms beside the bench's flash-decoding (`decode_sweep.decode_attention`).
for h in (16, 64, 128):
    if not EK.flashmla_loaded():
        break
    try:
        b, n = 4, 4096
        lat, qm = randn(b, n, 1, 576), randn(b, h, 576)
        r = torch.softmax(torch.einsum("bhd,bld->bhl", qm.double(), lat[:, :, 0].double()) * 0.07, -1)
        want = torch.einsum("bhl,bld->bhd", r, lat[:, :, 0, :512].double())
        got = EK.flashmla_decode(qm, lat, 0.07)
        s = D.splits_for(b, n, torch.cuda.get_device_properties(0).multi_processor_count)
        times = {"FlashMLA": ms(lambda: EK.flashmla_decode(qm, lat, 0.07)),
                 "tpplan flash-decoding": ms(lambda: D.decode_attention(qm, lat, lat[..., :512], 0.07, s))}
        out[f"FlashMLA decode {h}h"] = f"{errs(got, want)}; ms {times}"
    except Exception as exc:
        out[f"FlashMLA decode {h}h"] = f"error {type(exc).__name__}: {exc}"[:400]
out["kernel refusals (fell back)"] = GK.kernel_refusals()
# Last: the bench's own kernels at the FA3 shapes (TPPLAN_ENGINE_FA3=0: fla's window kernel, SDPA per chunk, the
# sinks' flash; k/v repeated where the kernel needs) and the Triton sparse kernel at 128 latent heads, ms per call.
os.environ["TPPLAN_ENGINE_FA3"] = "0"
for label, q, k, v, d, n, w, ch, sk in own_later:
    try:
        ko, vo = (k, v) if GK.takes_gqa(q, v, w, ch, sk) else KA.repeat_kv(k, v, n)
        own = SK.serving_attention(q, ko, vo, d**-0.5, w, ch, sk)[0]
        out[f"own kernel {label}"] = f"{own[:60]}: ms {ms(lambda: SK.serving_attention(q, ko, vo, d**-0.5, w, ch, sk))}"
    except Exception as exc:
        out[f"own kernel {label}"] = f"error {type(exc).__name__}: {exc}"[:400]
if EK.flashmla_loaded() and GK._sparse_kernel() is not None:
    try:
        from tpplan.bench import sparse_attention as SPA
        t, s_all = 512, 4096
        q4, kv = randn(t, 128, 576), randn(s_all, 1, 576)
        idx = torch.randint(0, s_all - t, (t, 2048), device=dev)
        out["own kernel Triton sparse 128h latent"] = f"ms {ms(lambda: SPA.sparse_attention(q4, kv, kv[..., :512], idx, 576**-0.5))}"
    except Exception as exc:
        out["own kernel Triton sparse 128h latent"] = f"error {type(exc).__name__}: {exc}"[:400]
os.environ["TPPLAN_ENGINE_FA3"] = "1"
