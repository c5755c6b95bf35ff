"""Checks on the GPU before the timed runs: the new kernels equal the references in bf16 (relative error).

2026-12-06d (issue 34): the 06c checks, then fla's window kernel (`masked_attention.fla_window_attention`,
the bench's window kernel on CUDA) at Gemma 3's and gpt-oss's head dims and windows, with and without a
cache before the chunk, against the fp32 reference, and the name `serving_attention` records for it.
Later: the fused DSA indexer, then DSA's sparse attention kernel (`bench.sparse_attention`; error and ms
against the reference, in the latent and the per-head layout).
`python3 gpu_check.py cuda` (run.sh passes it); an "error" line means a check raised."""
import sys
import torch
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
dt = torch.bfloat16 if dev == "cuda" else torch.float32
from tpplan.bench import masked_attention as MA, decode_sweep as D, serving_kernels as SK, gpu_kernels as GK
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
    for label, (t, s, n, kvh, d, w, snk) in {"gptoss w128+sinks": (512, 512, 8, 8, 64, 128, True),
                                             "gptoss w128+sinks cache": (512, 1536, 8, 8, 64, 128, True),
                                             "gptoss 8h/1kv w128+sinks cache": (512, 1536, 8, 1, 64, 128, True),
                                             "gemma3 w1024": (2048, 2048, 4, 4, 256, 1024, False),
                                             "gemma3 4h/2kv w1024 cache": (1024, 3072, 4, 2, 256, 1024, False)}.items():
        if MA.fla_parallel_attn() is None:
            out["fla window"] = "fla.ops.attn.parallel does not import here: not checked"
            break
        try:
            q3, k3, v3 = qkv(t, s, n, d)
            k3, v3 = k3[:, :kvh].contiguous(), v3[:, :kvh].contiguous()  # GQA: kvh KV heads, fla groups them
            sk = torch.randn(n, device=dev) if snk else None
            want = ref(q3, *KA.repeat_kv(k3, v3, n), d**-0.5, window=w, sinks=sk)
            out[f"fla window {label}"] = rel(MA.fla_window_attention(q3, k3, v3, d**-0.5, w, sk), want)
            got, name = SK.serving_attention(q3, k3, v3, d**-0.5, w, None, sk)[::-1]
            out[f"serving window {label} ran"] = (name, rel(got, want))
        except Exception as exc:
            out[f"fla window {label}"] = f"error {type(exc).__name__}: {exc}"[:400]
    # The fused DSA indexer (bf16 Triton scores + torch.topk) against the fp32 reference: index-score relative
    # error, and the share of the reference's selected earlier keys the fused kernel also selects (mean, worst row).
    for label, (t, ctx, hi) in {"dsv32 64h": (2048, 0, 64), "dsv32 64h cache": (1024, 8192, 64),
                                "glm51 32h": (4096, 0, 32)}.items():
        if not GK.fused_indexer_ok(torch.empty(1, device=dev), 128):
            out["fused indexer"] = "not on CUDA or triton missing: not checked"
            break
        try:
            from tpplan.bench import fused_indexer as FI
            from tpplan.runtime.kernels_local import Rope, rope_cos_sin
            pos = torch.arange(ctx, ctx + t, device=dev)
            qi, ki, wi = (torch.randn(t, hi * 128, device=dev, dtype=dt), torch.randn(t, 128, device=dev, dtype=dt),
                          torch.randn(t, hi, device=dev, dtype=dt))
            prior = torch.randn(ctx, 128, device=dev)
            kw = dict(head_dim=128, rope_dim=64, positions=pos, rope=Rope(), topk=2048,
                      k_norm_weight=torch.ones(128, device=dev), k_norm_bias=torch.zeros(128, device=dev))
            want = KA.dsa_indexer(qi, ki, wi, **kw, cache={"k": prior.clone()})
            name, got = GK.serving_indexer(qi, ki, wi, **kw, cache={"k": prior.clone()})
            s_all = ctx + t
            causal = torch.arange(s_all, device=dev)[None] <= pos[:, None]
            keep_w, keep_g = KA.index_mask(want, s_all) & causal, KA.index_mask(got, s_all) & causal
            share = (keep_w & keep_g).sum(1).float() / keep_w.sum(1).clamp(min=1).float()
            out[f"fused indexer {label} ran"] = name
            out[f"fused indexer {label} kept-key overlap mean / worst row"] = (float(share.mean()), float(share.min()))
            cos, sin = rope_cos_sin(pos[:256], 64, Rope())
            qf = KA.indexer_query(qi[:256], 128, 64, cos, sin, False)
            keys = torch.cat([prior, KA.indexer_key(ki, kw["k_norm_weight"], kw["k_norm_bias"], 64,
                                                    *rope_cos_sin(pos, 64, Rope()), False)])
            wf = wi[:256].float() * (hi**-0.5 * 128**-0.5)
            ref_s = torch.einsum("th,ths->ts", wf, torch.relu(torch.einsum("thd,sd->ths", qf, keys)))
            got_s = FI.index_scores(qf.to(dt), keys.to(dt), wf, pos[:256])
            fin = torch.isfinite(got_s)
            out[f"fused indexer {label} score rel err (256 rows)"] = rel(got_s[fin], ref_s[fin])
            # Tie-blind: the fp32 scores of the keys each kept, sorted, against the reference's (256 rows); the
            # largest gap as a share of the largest score (ties and near-boundary bf16 swaps give ~0).
            ref_c = ref_s.masked_fill(~causal[:256], float("-inf"))
            a, b = (ref_c.gather(1, i[:256]).sort(1, descending=True).values for i in (want, got))
            both = torch.isfinite(a) & torch.isfinite(b)
            gap = float((a - b)[both].abs().max() / ref_c[causal[:256]].abs().max()) if both.any() else 0.0
            out[f"fused indexer {label} kept-score gap (256 rows)"] = (gap, bool(torch.equal(torch.isfinite(a), torch.isfinite(b))))
        except Exception as exc:
            out[f"fused indexer {label}"] = f"error {type(exc).__name__}: {exc}"[:400]
    # DSA's sparse attention (bench.sparse_attention, added after calls 4-5, which ran without it; checked on a
    # CPU only when written): the Triton kernel that gathers each query's top-k keys against the fp32 reference
    # (masked attention over all keys), in the engines' latent MQA form (one 576-wide row per key, values its
    # first 512) and in the runtime's per-head MLA layout (what the bench hands it), 512 queries after 3584
    # cached keys, topk 2048; ms per call (CUDA events, 5 calls after one warm-up) beside the reference's.
    for label, (n, kvh, d, dv) in {"dsv32 latent 128h": (128, 1, 576, 512), "dsv32 per-head 128h": (128, 128, 192, 128),
                                   "glm51 latent 64h": (64, 1, 576, 512), "glm51 per-head 64h": (64, 64, 256, 256)}.items():
        if not GK.sparse_attention_ok(torch.empty(1, device=dev)) or GK._sparse_kernel() is None:
            out["sparse attention"] = "not on CUDA or triton missing: not checked"
            break
        try:
            from tpplan.bench import sparse_attention as SPA
            t, s_all = 512, 4096
            q4, k4, v4 = qkv(t, s_all, kvh, d, dv)
            q4 = torch.randn(t, n, d, device=dev, dtype=dt)
            if kvh == 1:
                v4 = k4[..., :dv]  # the latent: values are the key rows' first 512 columns
            pos = torch.arange(s_all - t, s_all, device=dev)
            score = torch.rand(t, s_all, device=dev).masked_fill(torch.arange(s_all, device=dev)[None] > pos[:, None], -1)
            idx = score.topk(2048, dim=1).indices  # distinct; a query with fewer earlier keys gets later ones (skipped)
            sc = d**-0.5
            kept = KA.index_mask(idx, s_all)  # not `keep`: the 06c checks after this loop use it (06e call 2)
            want = ref(q4, *KA.repeat_kv(k4, v4, n), sc, kept)
            got = SPA.sparse_attention(q4, k4, v4, idx, sc)
            times = {}
            for name_, fn in {"kernel": lambda: SPA.sparse_attention(q4, k4, v4, idx, sc),
                              "reference": lambda: KA.causal_attention(q4, *KA.repeat_kv(k4, v4, n), sc, kept)}.items():
                fn()
                a_, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a_.record()
                for _ in range(5):
                    fn()
                b_.record()
                torch.cuda.synchronize()
                times[name_] = round(a_.elapsed_time(b_) / 5, 3)
            out[f"sparse attention {label} rel err / ms kernel, reference"] = (rel(got, want), times)
        except Exception as exc:
            out[f"sparse attention {label}"] = f"error {type(exc).__name__}: {exc}"[:400]
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
out["kernel refusals (fell back)"] = GK.kernel_refusals()
for k_, v_ in out.items():
    print(f"check {k_}: {v_}")
