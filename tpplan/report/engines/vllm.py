"""vLLM flags per plan and the static conditions vLLM checks (sources: package docstring)."""

from __future__ import annotations

from tpplan.layout.plan import Plan
from tpplan.models.spec import ModelSpec
from tpplan.report.engines.base import (
    SRC_VLLM_MOE,
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


# All-to-all backends for which vLLM's `ParallelConfig.use_sequence_parallel_moe` holds (SRC_VLLM_PAR;
# pplx is left out on purpose: it handles duplicated tokens itself).
VLLM_SP_MOE_BACKENDS = ("allgather_reducescatter", "naive", "deepep_high_throughput", "deepep_low_latency", "mori")


def _vllm_sp_moe_gate(spec: ModelSpec, tp: int, dp: int, backend: str) -> tuple[Condition, ...]:
    """vLLM's model-level MoE sequence parallelism (`use_sequence_parallel_moe`): without it every
    TP rank of an EP deployment dispatches the same replicated tokens."""
    return (
        Condition(
            f"data-parallel size > 1 for MoE sequence parallelism (here DP {dp}); at DP 1 vLLM keeps "
            "use_sequence_parallel_moe off and every TP rank dispatches the whole replicated batch",
            dp > 1,
            "skips silently",
            SRC_VLLM_PAR,
        ),
        Condition(f"tensor-parallel size > 1 (here {tp})", tp > 1, "skips silently", SRC_VLLM_PAR),
        Condition(
            f"--all2all-backend one of {', '.join(VLLM_SP_MOE_BACKENDS)} (here {backend})",
            backend in VLLM_SP_MOE_BACKENDS,
            "skips silently",
            SRC_VLLM_PAR,
        ),
        Condition(
            f"the model's MoE block reads is_sequence_parallel (DeepSeek-V2/V3, Qwen MoE, Nemotron-H; "
            f"per model file, {spec.model_type or 'this model'} not checked)",
            None,
            "skips silently",
            SRC_VLLM_MOE,
        ),
    )


def vllm_recipe(
    plan: Plan,
    spec: ModelSpec,
    *,
    tp: int,
    pp: int = 1,
    nodes: int = 1,
    chunk: int = 8192,
    gpu: str = "",
    dp: int = 1,
) -> EngineRecipe:
    """vLLM flags for `plan` on `spec` at TP `tp` (x PP `pp`, x DP `dp`) over `nodes` nodes of `gpu`."""
    if plan.dp_attention:
        from tpplan.report.engines.dp_attention import vllm_dp_recipe

        return vllm_dp_recipe(plan, spec, tp, chunk)
    fam = family(plan)
    base = [f"--tensor-parallel-size {tp}"]
    if pp > 1:
        base.append(f"--pipeline-parallel-size {pp}")
    base += ["--enable-chunked-prefill", f"--max-num-batched-tokens {chunk}"]
    if nodes > 1:
        base.append("--distributed-executor-backend ray")
    moe = _moe(spec)
    if fam == "sp-moe":
        backend = "deepep_high_throughput"
        conds = (
            Condition("the model has routed experts", moe is not None, "refuses", SRC_VLLM_PAR),
            Condition("EP spans all TP x DP ranks (there is no separate EP size)", True, "adjusts", SRC_VLLM_PAR),
            *_vllm_sp_moe_gate(spec, tp, dp, backend),
        )
        dp_args = (f"--data-parallel-size {dp}",) if dp > 1 else ()
        args = (*base, *dp_args, "--enable-expert-parallel", f"--all2all-backend {backend}")
        on = all(c.met is not False for c in conds)
        summary = (
            "expert parallel with DeepEP; attention output all-reduced, then each TP rank dispatches its "
            "own chunk and the MoE output is all-gathered"
            if on
            else "expert parallel with DeepEP, but MoE sequence parallelism is off: every TP rank "
            "dispatches the whole replicated batch"
        )
        notes = (
            "vLLM's MoE sequence parallelism is model-level: the MoE block chunks the replicated (all-reduced) "
            "hidden per TP rank and all-gathers its output, so the attention side stays an all-reduce, not "
            f"the plan's reduce-scatter ({SRC_VLLM_MOE}).",
        )
        return EngineRecipe("vLLM", plan.name, args, "partly", summary, conds, notes)
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
