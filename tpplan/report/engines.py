"""Server flags that realise a plan in SGLang and vLLM, and the engines' own static conditions.

A plan that tpplan calls legal and fast is worth nothing if the engine silently ignores the flag
that should turn it on. SGLang's input-scattered path is the seed's example: its gate only logs an
info line when a condition fails and runs the ordinary all-reduce path. This module writes the
flags per plan and checks the conditions it can decide from the model and the plan; conditions
that depend on other server settings are listed as "keep" conditions.

Facts come from the engines' sources (paths relative to each repository's root):
- SGLang `python/sglang/srt/layers/communicator/adapters/attention.py`: `AttnTpContext.init_context`
  allows input-scattered only with `--enable-attn-tp-input-scattered`, CUDA or NPU, `q_lora_rank`
  set, not DSA (unless MHC), tp_size > 1, no DP attention, `moe_a2a_backend` none, no MoE-dense
  full DP, no piecewise CUDA graph for prefill, speculative algorithm not EAGLE3; otherwise it
  only logs "attn_tp_input_scattered is not enabled while other conditions are not met".
  `use_input_scattered` applies it to extend (prefill) batches only, not target-verify, not
  two-batch-overlap batches. `AttentionInputs.fetch_hidden_states` all-gathers the scattered hidden
  for any consumer that needs it (how a gated MLA still runs, paying the hidden all-gather).
- SGLang `python/sglang/srt/server_args.py` `_handle_a2a_moe`: `--moe-a2a-backend deepep` (and
  mooncake) sets ep_size = tp_size; `--deepep-mode normal` disables CUDA graphs.
- SGLang `python/sglang/srt/layers/communicator/__init__.py` (`sparse_mlp_scatter_mode`): with an
  a2a backend the MoE runs on the rank's own (scattered) tokens; `LayerCommunicator` builds the
  input-scattered steps only when `_input_can_be_scattered` (tp > 1, attention DP 1, no a2a backend).
- SGLang `python/sglang/srt/layers/layernorm_sp.py`: `--enable-layernorm-sp` takes effect only for
  an allowlist of architectures (Qwen3 family); for others the flag does not enable SP.
- SGLang `docs/advanced_features/server_arguments.md`: `--tp-size/--tp`, `--ep-size/--ep`,
  `--moe-a2a-backend {none, deepep, mooncake, ...}`, `--moe-runner-backend ... flashinfer_mxfp4`,
  `--pp-size`, `--chunked-prefill-size`, `--enable-dp-attention`, `--dp`.
- vLLM `vllm/config/parallel.py` (`ParallelConfig`): `--tensor-parallel-size`,
  `--pipeline-parallel-size`, `--data-parallel-size`, `--enable-expert-parallel` (EP over the
  TP x DP ranks; no separate EP size), `--all2all-backend` (default `allgather_reducescatter`;
  `deepep_high_throughput` for prefill, `deepep_low_latency`, `pplx`, `naive`, ...).
- vLLM `vllm/compilation/passes/fusion/sequence_parallelism.py` (earlier
  `vllm/compilation/sequence_parallelism.py`), `SequenceParallelismPass`: a torch.compile pattern
  pass that rewrites all-reduce + RMSNorm into reduce-scatter + norm + all-gather, switched on by
  the compilation config's `pass_config.enable_sp` (`enable_sequence_parallelism` in earlier
  releases; `vllm/config/vllm.py` also turns it on for `fuse_gemm_comms`, async TP); where the
  pattern does not match, nothing changes and nothing is logged as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tpplan.models.spec import MLASpec, ModelSpec, MoESpec
from tpplan.plans.plan import Plan

Effect = Literal["refuses", "skips silently", "adjusts", "keep"]

SRC_SGL_ATTN = "sgl-project/sglang python/sglang/srt/layers/communicator/adapters/attention.py"
SRC_SGL_ARGS = "sgl-project/sglang python/sglang/srt/server_args.py"
SRC_SGL_COMM = "sgl-project/sglang python/sglang/srt/layers/communicator/__init__.py"
SRC_SGL_SP = "sgl-project/sglang python/sglang/srt/layers/layernorm_sp.py"
SRC_VLLM_PAR = "vllm-project/vllm vllm/config/parallel.py"
SRC_VLLM_SP = "vllm-project/vllm vllm/compilation/passes/fusion/sequence_parallelism.py"

# Architectures SGLang's --enable-layernorm-sp accepts (layernorm_sp.py allowlist), as model_type.
_SGLANG_SP_MODEL_TYPES = frozenset({"qwen3"})


@dataclass(frozen=True)
class Condition:
    """One static condition of the engine, and whether this model/plan meets it."""

    text: str
    met: bool | None  # None: depends on settings outside the plan; keep them as stated
    effect: Effect  # what the engine does when it is not met
    source: str

    def line(self) -> str:
        """One line for the report."""
        mark = {True: "ok", False: "FAILS", None: "keep"}[self.met]
        return f"[{mark}] {self.text} (if not: {self.effect}; {self.source})"


@dataclass(frozen=True)
class EngineRecipe:
    """The flags for one engine and plan, and what could stop them from doing what they say."""

    engine: str
    plan: str
    args: tuple[str, ...]
    realises: Literal["yes", "partly", "no"]
    summary: str
    conditions: tuple[Condition, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def blocked(self) -> bool:
        """True when a condition this model/plan fails makes the engine refuse or skip the plan."""
        return any(c.met is False and c.effect in ("refuses", "skips silently") for c in self.conditions)

    def command(self, model_path: str = "<model-path>") -> str:
        """The launch command line (multi-node placeholders in angle brackets)."""
        if self.realises == "no":
            return ""
        head = (
            f"python -m sglang.launch_server --model-path {model_path}"
            if self.engine == "SGLang"
            else f"vllm serve {model_path}"
        )
        return " ".join([head, *self.args])


def _mla(spec: ModelSpec) -> MLASpec | None:
    return next((layer.attn for layer in spec.layers if isinstance(layer.attn, MLASpec)), None)


def _moe(spec: ModelSpec) -> MoESpec | None:
    return next((layer.mlp for layer in spec.layers if isinstance(layer.mlp, MoESpec)), None)


def _family(plan: Plan) -> str:
    """The engine-level family of a plan: named plans by name, found plans by their decisions."""
    named = {
        "baseline",
        "input-scattered",
        "input-scattered+restore",
        "latent-scattered",
        "sequence-parallel",
        "gate-aware",
        "sp-moe",
    }
    if plan.name in named:
        return plan.name
    attn_side = [r for r in (*plan.replicate, *plan.a2a) if "/moe." not in r and "/dense." not in r]
    if attn_side:
        return "gate-aware"  # replication/all-to-all around attention projections: no engine flag does it
    if plan.moe == "a2a":
        return "sp-moe"
    if plan.moe == "ep":
        return "ep"
    if plan.replicate or plan.a2a:
        return "gate-aware"
    if plan.stream != plan.reduce or plan.gather:
        return "input-scattered"
    return "baseline"


def sglang_recipe(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192
) -> EngineRecipe:
    """SGLang flags for `plan` on `spec` at TP `tp` (x PP `pp`) over `nodes` nodes."""
    fam = _family(plan)
    base = [f"--tp-size {tp}"]
    if pp > 1:
        base.append(f"--pp-size {pp}")
    base.append(f"--chunked-prefill-size {chunk}")
    if nodes > 1:
        base += [f"--nnodes {nodes}", f"--node-rank <0..{nodes - 1}>", "--dist-init-addr <head-ip>:<port>"]
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
        return EngineRecipe(
            "SGLang", plan.name, tuple(args), "yes", "DeepEP dispatch/combine", tuple(conds), tuple(notes)
        )
    if fam in ("input-scattered", "input-scattered+restore"):
        args = [*base, "--enable-attn-tp-input-scattered", "--moe-a2a-backend none"]
        conds += [
            Condition("tp_size > 1", tp > 1, "skips silently", SRC_SGL_ATTN),
            Condition(
                "the MLA has q_lora_rank (fused qkv_a latent)",
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
        ]
        gated = mla is not None and mla.output_gate
        linear = any(layer.attn.kind in ("kda", "gdn") for layer in spec.layers)
        if gated or linear:
            notes.append(
                "The gate passes for this model, but its "
                + ("MLA output gate (g_proj) " if gated else "")
                + ("and " if gated and linear else "")
                + ("linear-attention projections " if linear else "")
                + "read the full hidden: SGLang's AttentionInputs.fetch_hidden_states all-gathers the "
                "scattered hidden for them, so the engine really runs input-scattered+restore "
                f"({SRC_SGL_ATTN})."
            )
        return EngineRecipe(
            "SGLang",
            plan.name,
            tuple(args),
            "partly" if gated or linear else "yes",
            "reduce-scatter the block output, token-local norm and qkv_a, all-gather the QKV latent",
            tuple(conds),
            tuple(notes),
        )
    if fam == "sequence-parallel":
        ok = spec.model_type in _SGLANG_SP_MODEL_TYPES
        conds += [
            Condition(
                f"architecture on the --enable-layernorm-sp allowlist (model_type {spec.model_type})",
                ok,
                "skips silently",
                SRC_SGL_SP,
            ),
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
    if fam in ("latent-scattered", "gate-aware"):
        why = (
            "the seed's research prototype; no SGLang flag shards only the latent GEMM"
            if fam == "latent-scattered"
            else "needs code: replicate the column-parallel projections that read the hidden (MLA g_proj, "
            "KDA q/k/v/f/b/g) and all-to-all their outputs; no SGLang flag does this"
        )
        return EngineRecipe("SGLang", plan.name, tuple(base), "no", why, (), ())
    args = [*base, "--moe-a2a-backend none"] if moe is not None else base
    return EngineRecipe(
        "SGLang", plan.name, tuple(args), "yes", "Megatron TP: all-reduce after o_proj and MLP/MoE", tuple(conds)
    )


def vllm_recipe(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192
) -> EngineRecipe:
    """vLLM flags for `plan` on `spec` at TP `tp` (x PP `pp`) over `nodes` nodes."""
    fam = _family(plan)
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
        return EngineRecipe(
            "vLLM",
            plan.name,
            (*base, cfg),
            "partly",
            "compile pass rewriting AR + RMSNorm into RS + norm + AG where the pattern matches",
            (
                Condition(
                    "the model's all-reduce + RMSNorm matches the pass's patterns (checked at compile time)",
                    None,
                    "skips silently",
                    SRC_VLLM_SP,
                ),
            ),
            ("earlier vLLM releases spell the pass_config key `enable_sequence_parallelism`",),
        )
    if fam in ("input-scattered", "input-scattered+restore", "latent-scattered", "gate-aware"):
        return EngineRecipe(
            "vLLM", plan.name, tuple(base), "no", "vLLM has no input-scattered attention path; needs code", (), ()
        )
    return EngineRecipe("vLLM", plan.name, tuple(base), "yes", "Megatron TP (the default)")


def recipes(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192
) -> list[EngineRecipe]:
    """Both engines' recipes for one plan."""
    kw = {"tp": tp, "pp": pp, "nodes": nodes, "chunk": chunk}
    return [sglang_recipe(plan, spec, **kw), vllm_recipe(plan, spec, **kw)]


__all__ = ["Condition", "EngineRecipe", "recipes", "sglang_recipe", "vllm_recipe"]
