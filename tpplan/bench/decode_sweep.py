"""The decode kernel sweep (issue 32): what one rank runs per decode step, timed on one GPU.

Decode prices were never measured: the planner priced a decode step's attention with the prefill
attention model (or, for MLA, the roofline of the absorbed form), its GEMMs at M = 1-512 rows from the
prefill GEMM table and its experts at a handful of tokens per expert from the prefill expert model.
This sweep times, with serving-class kernels as the bench runs them:

- `decode_gqa`: one new token per request against its KV cache, GQA with the query heads of a KV head
  packed as the query rows and the cache split over the SMs (flash-decoding: `decode_attention`, one
  flash call over [batch x splits] and a log-sum-exp merge), at per-rank heads of TP1-8 (Llama-3-70B
  64/8 x 128, gpt-oss 64/8 x 64, Qwen3-Next 16/2 x 256);
- `decode_mla`: MLA absorbed (what SGLang and vLLM run for decode): every head of the rank scores the
  cached latent (kv_lora 512 + rope 64) and sums its first 512 columns, as MQA over the latent, at
  4-128 heads per rank (by FlashMLA's decode where `TPPLAN_ENGINE_KERNELS` gives the engines' builds:
  `engine_kernels`; the row's `variant` says which ran);
- `gemm_small`: bf16 GEMMs at M = 1-512 over the per-rank projection shapes (`rank_sweep.gemm_cases`), each
  call on the next of several weight copies (more than the L2 holds);
- `experts_small`: the routed-experts op (`grouped_routed_experts`) at 1-512 tokens over the per-rank
  expert slices of TP8/TP32/EP8/EP32 (`rank_shapes`): a few rows per expert.

Batch 1-512, KV lengths 1K-128K (cases whose cache exceeds `MAX_KV_BYTES` are left out: their regime,
HBM-bound, is measured at the sizes below). `python -m tpplan.bench.decode_sweep OUT.json BUDGET_S
[FAMILIES]` (GPU); the CPU tests run tiny cases.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from tpplan.bench.rank_timing import DEVICE, Case, _randn, measure

BATCHES = (1, 4, 16, 64, 256, 512)
KV_LENS = (1024, 4096, 16384, 65536, 131072)
GQA_SHAPES = ((64, 8, 128), (32, 4, 128), (16, 2, 128), (8, 1, 128), (64, 8, 64), (8, 1, 64), (16, 2, 256),
              (8, 1, 256))  # fmt: skip
MLA_HEADS = (128, 64, 32, 16, 8, 4)
MLA_LATENT, MLA_ROPE = 512, 64
MAX_KV_BYTES = 12 * 2**30
SMALL_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EXPERT_TOKENS = (1, 16, 128, 512)
EXPERT_SPLITS = ("tp8", "tp32", "ep8", "ep32")
MAX_EXPERT_BYTES = 6 * 2**30
SPLIT_KEYS = 256  # fewest keys per split of the flash-decoding kernel


def kv_bytes(c: Case) -> float:
    """Bytes of the case's cache (bf16): k and v per KV head (GQA) or the latent once (MLA)."""
    if c["family"] == "decode_mla":
        return 2.0 * c["batch"] * c["kv"] * (MLA_LATENT + MLA_ROPE)
    return 2.0 * c["batch"] * c["kv"] * c["kv_heads"] * 2 * c["d"]


def decode_cases(batches: tuple[int, ...] = BATCHES, kv_lens: tuple[int, ...] = KV_LENS,
                 max_bytes: float = MAX_KV_BYTES) -> dict[str, list[Case]]:  # fmt: skip
    """Every decode family's cases, the caches above `max_bytes` left out."""
    from tpplan.bench.rank_shapes import rank_shapes
    from tpplan.bench.rank_sweep import gemm_cases

    gqa = [{"family": "decode_gqa", "heads": h, "kv_heads": kv, "d": d, "batch": b, "kv": n}
           for h, kv, d in GQA_SHAPES for b in batches for n in kv_lens]  # fmt: skip
    mla = [
        {"family": "decode_mla", "heads": h, "batch": b, "kv": n} for h in MLA_HEADS for b in batches for n in kv_lens
    ]
    shapes = sorted({(c["k"], c["n"]) for c in gemm_cases()})
    gemm = [{"family": "gemm_small", "m": m, "k": k, "n": n} for k, n in shapes for m in SMALL_M]
    ex = [r for r in rank_shapes()["experts"] if r["split"] in EXPERT_SPLITS
          and 3 * r["local"] * r["inter"] * r["width"] * 2 <= MAX_EXPERT_BYTES]  # fmt: skip
    keys = ("experts", "local", "top_k", "width", "inter", "split")
    experts = [{"family": "experts_small", **{k: r[k] for k in keys}, "tokens": t} for r in ex for t in EXPERT_TOKENS]
    return {
        "decode_gqa": [c for c in gqa if kv_bytes(c) <= max_bytes],
        "decode_mla": [c for c in mla if kv_bytes(c) <= max_bytes],
        "gemm_small": gemm,
        "experts_small": experts,
    }


def splits_for(rows: int, keys: int, sms: int) -> int:
    """Key splits per (request, KV head): enough that `rows` x splits fills twice the SMs, each split at
    least `SPLIT_KEYS` keys and dividing `keys` (a power of two)."""
    want = max(1, math.ceil(2 * sms / max(1, rows)))
    most = max(1, keys // SPLIT_KEYS)
    s = 1
    while s * 2 <= min(want, most) and keys % (s * 2) == 0:
        s *= 2
    return s


def decode_attention(q: Any, k: Any, v: Any, scale: float, splits: int) -> Any:
    """One new token per request: q [B, h, d] against k [B, L, hk, d], v [B, L, hk, dv] -> [B, h, dv].
    The h / hk query heads of a KV head are its query rows; the L keys are cut into `splits` parts run
    as separate sequences, then merged by their log-sum-exp (flash-decoding)."""
    import torch

    from tpplan.bench.masked_attention import _with_lse

    b, h, d = q.shape
    n, hk, dv = k.shape[1], k.shape[2], v.shape[-1]
    rep, c = h // hk, n // splits
    qg = q.reshape(b, 1, hk, rep, d).expand(b, splits, hk, rep, d).reshape(b * splits, hk, rep, d)
    kk = k.reshape(b * splits, c, hk, d).transpose(1, 2)
    vv = v.reshape(b * splits, c, hk, dv).transpose(1, 2)
    with torch.no_grad():
        out, lse = _with_lse(qg, kk, vv, scale, None, False)  # [B*s, hk, rep, dv], [B*s, hk, rep]
        if splits == 1:
            return out.reshape(b, h, dv)
        lse = lse.reshape(b, splits, hk, rep)
        w = torch.softmax(lse, dim=1)[..., None]
        merged = (out.reshape(b, splits, hk, rep, dv).float() * w).sum(1)
    return merged.to(q.dtype).reshape(b, h, dv)


def _sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count if DEVICE[0] == "cuda" else 8


def run_decode_gqa(c: Case) -> dict[str, Any]:
    b, h, hk, d, n = c["batch"], c["heads"], c["kv_heads"], c["d"], c["kv"]
    q, k, v = _randn(b, h, d), _randn(b, n, hk, d), _randn(b, n, hk, d)
    s = splits_for(b * hk, n, _sms())
    return {**measure(lambda: decode_attention(q, k, v, d**-0.5, s)), "splits": s}


FLASH_DECODING = "tpplan flash-decoding (SDPA flash per key split, merged by log-sum-exp)"


def run_decode_mla(c: Case) -> dict[str, Any]:
    """Absorbed MLA: MQA over the latent cache [B, L, 1, 576], values its first 512 columns; by FlashMLA's
    decode where the engine kernels are loaded (`engine_kernels.flashmla_decode`; env TPPLAN_ENGINE_MLA_DECODE
    "0" for ours), else `decode_attention`. The kernel is recorded (`variant`)."""
    b, h, n = c["batch"], c["heads"], c["kv"]
    q, lat = _randn(b, h, MLA_LATENT + MLA_ROPE), _randn(b, n, 1, MLA_LATENT + MLA_ROPE)
    engine = _engine_mla_decode(q, lat)
    if engine is not None:
        from tpplan.bench.engine_kernels import FLASHMLA_DECODE

        return {**measure(lambda: engine(q, lat, 0.07)), "variant": FLASHMLA_DECODE}
    s = splits_for(b, n, _sms())
    res = measure(lambda: decode_attention(q, lat, lat[..., :MLA_LATENT], 0.07, s))
    return {**res, "splits": s, "variant": FLASH_DECODING}


def _engine_mla_decode(q: Any, lat: Any) -> Any | None:
    """`engine_kernels.flashmla_decode` where on CUDA, enabled, loaded and it runs at this head count (a first
    call that raises is recorded in `gpu_kernels.kernel_refusals` and the head count left to ours)."""
    from tpplan.bench import engine_kernels as EK
    from tpplan.bench import gpu_kernels as GK

    if not q.is_cuda or not EK.engine_enabled("TPPLAN_ENGINE_MLA_DECODE") or not EK.flashmla_loaded():
        return None
    key = f"FlashMLA decode, {q.shape[1]} heads"
    if key in GK.kernel_refusals():
        return None
    try:
        EK.flashmla_decode(q, lat, 0.07)
    except Exception as exc:  # e.g. a head count this build refuses
        GK._refuse(key, exc)
        return None
    return EK.flashmla_decode


ROTATE_BYTES = 128 * 2**20  # weight copies a GEMM case cycles through: more than the 50 MB L2 of an H100/H200


def run_gemm_small(c: Case) -> dict[str, Any]:
    """A bf16 GEMM [m, k] x [k, n] (cuBLAS), timed both ways: at M <= 512 the launch can bound it. Each call
    reads the next of enough weight copies to overflow the L2 (`ROTATE_BYTES`), as a decode step does whose
    other layers evict them: one copy read again ran above the HBM rate (the first H100 sweep)."""
    import torch

    copies = max(1, min(64, -(-ROTATE_BYTES // (2 * c["k"] * c["n"])))) if DEVICE[0] == "cuda" else 2
    a, ws = _randn(c["m"], c["k"]), [_randn(c["k"], c["n"]) for _ in range(copies)]
    turn = [0]

    def call() -> Any:
        turn[0] = (turn[0] + 1) % copies
        return torch.mm(a, ws[turn[0]])

    return {**measure(call), "copies": copies}


def run_experts_small(c: Case) -> dict[str, Any]:
    from tpplan.bench.rank_runners import run_experts

    return run_experts(c)


DECODE_RUNNERS = {"decode_gqa": run_decode_gqa, "decode_mla": run_decode_mla, "gemm_small": run_gemm_small,
                  "experts_small": run_experts_small}  # fmt: skip
SHARE = {"decode_gqa": 0.35, "decode_mla": 0.3, "gemm_small": 0.1, "experts_small": 0.25}


def main(argv: list[str] | None = None) -> None:
    """`python -m tpplan.bench.decode_sweep OUT.json BUDGET_S [FAMILY,FAMILY]`."""
    from tpplan.bench.rank_sweep import _device_or_cpu, run
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file

    args = sys.argv[1:] if argv is None else argv
    try:
        out, budget = str(check_file("OUT.json", args[0])), float(args[1])
    except (TpplanError, IndexError, ValueError) as exc:
        sys.exit(f"error: OUT.json BUDGET_S [FAMILIES]: {exc}")
    families = args[2].split(",") if len(args) > 2 else None
    _device_or_cpu()
    doc = run(out, budget, families, cases=decode_cases(), shares=SHARE, runners=DECODE_RUNNERS)
    print(f"{len(doc['points'])} points; skipped: {doc['skipped']}")


if __name__ == "__main__":
    main()


__all__ = ["DECODE_RUNNERS", "FLASH_DECODING", "decode_attention", "decode_cases", "kv_bytes", "splits_for"]
