"""vLLM flags per plan and the static conditions vLLM checks (sources: package docstring)."""

from __future__ import annotations

from tpplan.layout.plan import Plan
from tpplan.models.spec import ModelSpec
from tpplan.report.engines.base import (
    SRC_VLLM_PAR,
    SRC_VLLM_SP,
    Condition,
    EngineRecipe,
    _moe,
    _needs_code,
    family,
    gpu_capability,
)

# vLLM's sequence-parallelism gate (`get_sequence_parallelism_threshold` in SRC_VLLM_SP): per CUDA
# compute-capability family, the smallest hidden size and the smallest all-reduce per GPU (MiB) for
# which the pass applies; a capability without an entry (e.g. sm120, RTX PRO 6000) gets no SP.
VLLM_SP_MIN_HIDDEN = {90: 8192, 100: 8192}
VLLM_SP_MIN_MIB_PER_GPU = {90: 8, 100: 32}  # sm100 was 64 MiB in an earlier revision of the file


def _vllm_sp_gate(spec: ModelSpec, tp: int, chunk: int, gpu: str) -> tuple[Condition, ...]:
    cap = gpu_capability(gpu)
    if cap is None:
        return (
            Condition(
                f"vLLM has an SP threshold for this GPU ({gpu or 'unknown'}: generation not known)",
                None,
                "skips silently",
                SRC_VLLM_SP,
            ),
        )
    if cap not in VLLM_SP_MIN_HIDDEN:
        return (
            Condition(
                f"vLLM has an SP threshold for sm{cap} ({gpu}); it has one only for sm90 and sm100",
                False,
                "skips silently",
                SRC_VLLM_SP,
            ),
        )
    hidden = spec.hidden
    min_tokens = VLLM_SP_MIN_MIB_PER_GPU[cap] * 2**20 * tp // (hidden * 2)
    return (
        Condition(
            f"hidden size {hidden} >= {VLLM_SP_MIN_HIDDEN[cap]} (vLLM's minimum on sm{cap})",
            hidden >= VLLM_SP_MIN_HIDDEN[cap],
            "skips silently",
            SRC_VLLM_SP,
        ),
        Condition(
            f"batches of at least {min_tokens:,} tokens ({VLLM_SP_MIN_MIB_PER_GPU[cap]} MiB per GPU x TP{tp} "
            f"/ (hidden x 2 B)); the {chunk}-token chunk "
            + ("reaches it" if chunk >= min_tokens else "does not: every batch keeps the all-reduce"),
            chunk >= min_tokens,
            "skips silently",
            SRC_VLLM_SP,
        ),
    )


def vllm_recipe(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192, gpu: str = ""
) -> EngineRecipe:
    """vLLM flags for `plan` on `spec` at TP `tp` (x PP `pp`) over `nodes` nodes of `gpu`."""
    fam = family(plan)
    base = [f"--tensor-parallel-size {tp}"]
    if pp > 1:
        base.append(f"--pipeline-parallel-size {pp}")
    base += ["--enable-chunked-prefill", f"--max-num-batched-tokens {chunk}"]
    if nodes > 1:
        base.append("--distributed-executor-backend ray")
    moe = _moe(spec)
    if fam == "sp-moe":
        conds = (
            Condition("the model has routed experts", moe is not None, "refuses", SRC_VLLM_PAR),
            Condition("EP spans all TP x DP ranks (there is no separate EP size)", True, "adjusts", SRC_VLLM_PAR),
        )
        args = (*base, "--enable-expert-parallel", "--all2all-backend deepep_high_throughput")
        return EngineRecipe("vLLM", plan.name, args, "yes", "expert parallel with DeepEP dispatch/combine", conds)
    if fam == "ep":
        return EngineRecipe(
            "vLLM",
            plan.name,
            (*base, "--enable-expert-parallel"),
            "partly",
            f"vLLM's EP size is TP x DP ({tp}), not {plan.ep_size}: EP{plan.ep_size} inside TP{tp} has no flag",
            (Condition("EP size equals TP x DP", plan.ep_size == tp, "adjusts", SRC_VLLM_PAR),),
        )
    if fam == "sequence-parallel":
        cfg = """--compilation-config '{"pass_config": {"enable_sp": true}}'"""
        conds = (
            *_vllm_sp_gate(spec, tp, chunk, gpu),
            Condition(
                "the model's all-reduce + RMSNorm matches the pass's patterns (checked at compile time)",
                None,
                "skips silently",
                SRC_VLLM_SP,
            ),
        )
        blocked = any(c.met is False for c in conds)
        return EngineRecipe(
            "vLLM",
            plan.name,
            (*base, cfg),
            "no" if blocked else "partly",
            "compile pass rewriting AR + RMSNorm into RS + norm + AG where the pattern matches",
            conds,
            ("earlier vLLM releases spell the pass_config key `enable_sequence_parallelism`",),
        )
    if fam == "custom":
        return EngineRecipe("vLLM", plan.name, tuple(base), "no", _needs_code(plan), (), ())
    if fam in ("input-scattered", "input-scattered+restore", "latent-scattered", "gate-aware"):
        return EngineRecipe(
            "vLLM", plan.name, tuple(base), "no", "vLLM has no input-scattered attention path; needs code", (), ()
        )
    return EngineRecipe("vLLM", plan.name, tuple(base), "yes", "Megatron TP (the default)")
