"""SGLang flags per plan and the static conditions SGLang checks (sources: package docstring)."""

from __future__ import annotations

from tpplan.layout.plan import Plan
from tpplan.models.spec import ModelSpec
from tpplan.report.engines.base import (
    SRC_SGL_ARGS,
    SRC_SGL_ATTN,
    SRC_SGL_COMM,
    SRC_SGL_CONSTR,
    SRC_SGL_K3SP,
    SRC_SGL_LACP,
    SRC_SGL_SP,
    Condition,
    EngineRecipe,
    _mla,
    _moe,
    _needs_code,
    family,
    gpu_sm,
)

# Architectures SGLang's --enable-layernorm-sp accepts (layernorm_sp.py SP_SUPPORTED_ARCHITECTURES =
# {"Qwen3ForCausalLM"}), as the model_type of that architecture.
_SGLANG_SP_MODEL_TYPES = frozenset({"qwen3"})


# K3's fused SP reduce-scatter/all-gather (SRC_SGL_K3SP, `_init_state`): the GPU, attention-TP
# sizes, MoE all-to-all backends and hidden size it admits; anything else runs NCCL's RS/AG.
K3_SP_SM = 103
K3_SP_TP = (4, 8)
K3_SP_A2A = ("megamoe", "deepep")
K3_SP_HIDDEN = 7168


def _k3_sp_collective(spec: ModelSpec, tp: int, gpu: str, a2a: str) -> list[Condition]:
    """Whether SGLang's K3 SP-MoE path runs its fused multicast RS/AG or falls back to NCCL."""
    sm = gpu_sm(gpu)
    where = f"{gpu or 'GPU unknown'}" + (f", sm{sm}" if sm is not None else "")
    return [
        Condition(
            f"K3's fused SP reduce-scatter/all-gather needs an SM103 GPU (B300/GB300; here {where}), "
            "else SGLang runs them through NCCL",
            None if sm is None else sm == K3_SP_SM,
            "falls back",
            SRC_SGL_K3SP,
        ),
        Condition(
            f"K3's fused SP collectives cover attention-TP groups of 4 or 8 ranks (here {tp})",
            tp in K3_SP_TP,
            "falls back",
            SRC_SGL_K3SP,
        ),
        Condition(
            f"K3's fused SP collectives need --moe-a2a-backend megamoe or deepep (here {a2a})",
            a2a in K3_SP_A2A,
            "falls back",
            SRC_SGL_K3SP,
        ),
        Condition(
            f"K3's fused SP collectives are built for hidden size {K3_SP_HIDDEN} (this model: {spec.hidden})",
            spec.hidden == K3_SP_HIDDEN,
            "falls back",
            SRC_SGL_K3SP,
        ),
        Condition(
            "CustomAllReduceV2 enabled with multicast, a checked-in tuning table for this GPU and TP, "
            "SGLANG_K3_SP_COLLECTIVE not 0; per call bf16, tokens divisible by TP, the shard within the "
            "push buffer (and a table entry may itself keep NCCL for some sizes)",
            None,
            "falls back",
            SRC_SGL_K3SP,
        ),
    ]


def _prefill_cp(spec: ModelSpec, cp: int) -> list[Condition]:
    """The input-scattered gate under prefill context parallelism (`cp` attention-CP ranks)."""
    conds = [
        Condition(
            f"no prefill context parallelism (attention CP {cp}): the input-scattered steps are not built when "
            "--enable-prefill-cp shards tokens over attention CP > 1",
            cp == 1,
            "skips silently",
            SRC_SGL_CONSTR,
        )
    ]
    if spec.model_type == "kimi_k3":
        conds.append(
            Condition(
                "not with linear-attention prefill CP: Kimi-K3 prefill CP rejects "
                "--enable-attn-tp-input-scattered (and EP, PP, an a2a backend)",
                cp == 1,
                "refuses",
                SRC_SGL_LACP,
            )
        )
    return conds


def sglang_recipe(
    plan: Plan,
    spec: ModelSpec,
    *,
    tp: int,
    pp: int = 1,
    nodes: int = 1,
    chunk: int = 8192,
    gpu: str = "",
    cp: int = 1,
) -> EngineRecipe:
    """SGLang flags for `plan` on `spec` at TP `tp` (x PP `pp`) over `nodes` nodes of `gpu`;
    `cp` > 1 runs prefill context parallelism over that many attention-CP ranks."""
    fam = family(plan)
    base = [f"--tp-size {tp}"]
    if pp > 1:
        base.append(f"--pp-size {pp}")
    if cp > 1:
        base += [f"--attn-cp-size {cp}", "--enable-prefill-cp", "--cp-strategy zigzag"]
    base.append(f"--chunked-prefill-size {chunk}")
    if nodes > 1:
        base += [f"--nnodes {nodes}", f"--node-rank <0..{nodes - 1}>", "--dist-init-addr <head-ip>:<port>"]
    if plan.dp_attention:
        from tpplan.report.engines.dp_attention import sglang_dp_recipe

        return sglang_dp_recipe(plan, spec, base, tp)
    moe = _moe(spec)
    mla = _mla(spec)
    conds: list[Condition] = []
    notes: list[str] = []
    if pp > 1:
        conds.append(
            Condition(
                f"the model's SGLang implementation supports --pp-size (per model file; {spec.model_type} not checked)",
                None,
                "refuses",
                SRC_SGL_ARGS,
            )
        )
    if fam == "ep" and moe is not None:
        ep = plan.ep_size or tp
        args = [*base, f"--ep-size {ep}", "--moe-a2a-backend none"]
        return EngineRecipe(
            "SGLang",
            plan.name,
            tuple(args),
            "yes",
            f"expert parallelism without all-to-all: {moe.experts // ep} experts per EP group of {tp // ep} ranks",
            (*conds, Condition("ep_size divides tp_size", tp % ep == 0, "refuses", SRC_SGL_ARGS)),
        )
    if fam == "sp-moe":
        args = [*base, "--moe-a2a-backend deepep", "--deepep-mode normal"]
        conds += [
            Condition("the model has routed experts", moe is not None, "refuses", SRC_SGL_ARGS),
            Condition(
                "ep_size is forced to tp_size by _handle_a2a_moe (all experts spread over all TP ranks)",
                True,
                "adjusts",
                SRC_SGL_ARGS,
            ),
            Condition("deepep-mode normal disables CUDA graphs (prefill-only server)", True, "adjusts", SRC_SGL_ARGS),
        ]
        if moe is not None:
            conds.append(
                Condition(
                    f"{moe.experts} experts divide over {tp} ranks", moe.experts % tp == 0, "refuses", SRC_SGL_ARGS
                )
            )
        notes.append(
            "With an a2a backend the MoE runs on the rank's own tokens (sparse_mlp_scatter_mode -> SCATTERED) "
            f"and input-scattered attention is off ({SRC_SGL_COMM})."
        )
        summary = "DeepEP dispatch/combine"
        if spec.model_type == "kimi_k3":
            k3 = _k3_sp_collective(spec, tp, gpu, "deepep")
            conds += k3
            failed = [c for c in k3 if c.met is False]
            if failed:
                summary += "; the RS/AG around attention run on NCCL, not K3's fused kernels"
                notes.append(
                    "K3's fused SP collectives fall back to NCCL here (SGLang logs 'K3 SP collective requires "
                    "SM103, TP4/TP8, MegaMoE/DeepEP ...; using NCCL'): the plan runs, its reduce-scatter and "
                    f"all-gather are NCCL's, as the cost model prices them ({SRC_SGL_K3SP})."
                )
        return EngineRecipe("SGLang", plan.name, tuple(args), "yes", summary, tuple(conds), tuple(notes))
    if fam in ("input-scattered", "input-scattered+restore"):
        args = [*base, "--enable-attn-tp-input-scattered", "--moe-a2a-backend none"]
        conds += [
            Condition("tp_size > 1", tp > 1, "skips silently", SRC_SGL_ATTN),
            Condition(
                "the MLA has q_lora_rank (fused qkv_a latent)"
                if mla is not None
                else "the attention has a q_lora_rank latent (this model's has none)",
                mla is not None and mla.q_lora_rank is not None,
                "skips silently",
                SRC_SGL_ATTN,
            ),
            Condition("DP attention off (no --enable-dp-attention)", True, "skips silently", SRC_SGL_ATTN),
            Condition("--moe-a2a-backend none", True, "skips silently", SRC_SGL_ATTN),
            Condition(
                "no piecewise CUDA graph for prefill; speculative algorithm not EAGLE3",
                None,
                "skips silently",
                SRC_SGL_ATTN,
            ),
            Condition(
                "only extend (prefill) batches, not two-batch-overlap batches; tokens padded to a multiple of tp",
                None,
                "skips silently",
                SRC_SGL_ATTN,
            ),
            *_prefill_cp(spec, cp),
        ]
        gated = mla is not None and mla.output_gate
        linear = any(layer.attn.kind in ("kda", "gdn") for layer in spec.layers)
        passes = all(c.met is not False for c in conds)
        if (gated or linear) and passes:
            readers = " and ".join(
                x
                for x, on in (("the MLA output gate (g_proj)", gated), ("the linear-attention projections", linear))
                if on
            )
            notes.append(
                f"The gate passes for this model, but {readers} read the full hidden: SGLang's "
                "AttentionInputs.fetch_hidden_states all-gathers the scattered hidden for them, so the engine "
                f"really runs input-scattered+restore ({SRC_SGL_ATTN})."
            )
        # What the engine's dataflow is once the flag takes effect: the model's structure decides it,
        # not the server gates (a blocked flag is reported as blocked beside it).
        restores = gated or linear
        realises = (
            ("yes" if restores else "partly") if fam == "input-scattered+restore" else ("partly" if restores else "yes")
        )
        return EngineRecipe(
            "SGLang",
            plan.name,
            tuple(args),
            realises,  # type: ignore[arg-type]
            "reduce-scatter the block output, token-local norm and qkv_a, all-gather the QKV latent"
            + ("; the hidden is all-gathered again for the ops that read it" if restores else ""),
            tuple(conds),
            tuple(notes),
        )
    if fam == "sequence-parallel":
        ok = spec.model_type in _SGLANG_SP_MODEL_TYPES
        conds += [
            Condition(
                f"architecture on the --enable-layernorm-sp allowlist, Qwen3 dense (this model: {spec.model_type})",
                ok,
                "refuses",
                SRC_SGL_SP,
            ),
            Condition("tp_size > 1", tp > 1, "refuses", SRC_SGL_SP),
            Condition("DP attention off (no --enable-dp-attention)", True, "refuses", SRC_SGL_ARGS),
            Condition("SP excludes input-scattered (SP models have no q_lora)", True, "refuses", SRC_SGL_COMM),
        ]
        return EngineRecipe(
            "SGLang",
            plan.name,
            (*base, "--enable-layernorm-sp"),
            "yes" if ok else "no",
            "Megatron-style RS + AG around each block",
            tuple(conds),
        )
    if fam in ("latent-scattered", "gate-aware", "custom"):
        why = (
            "no SGLang flag token-shards only the latent GEMM (a research prototype)"
            if fam == "latent-scattered"
            else _needs_code(plan)
        )
        return EngineRecipe("SGLang", plan.name, tuple(base), "no", why, (), ())
    args = [*base, "--moe-a2a-backend none"] if moe is not None else base
    return EngineRecipe(
        "SGLang", plan.name, tuple(args), "yes", "Megatron TP: all-reduce after o_proj and MLP/MoE", tuple(conds)
    )
