"""Server flags that realise a plan in SGLang and vLLM, and the engines' own static conditions.

A plan that tpplan calls legal and fast is worth nothing if the engine silently ignores the flag
that should turn it on. SGLang's input-scattered path is the seed's example: its gate only logs an
info line when a condition fails and runs the ordinary all-reduce path. This module writes the
flags per plan and checks the conditions it can decide from the model and the plan; conditions
that depend on other server settings are listed as "keep" conditions.

Facts come from the engines' sources (paths relative to each repository's root). Versions read:
SGLang `adapters/attention.py` at commit 7665ff96 (the conditions below were re-checked against it
on 2026-12-01); vLLM `sequence_parallelism.py` in two revisions: the threshold tables below are the
later one (sm100 at 32 MiB per GPU; an earlier revision had 64, the oldest, commit 7d7e95dc, had no
thresholds at all). The other paths were read from the engines' main branches without a recorded
commit; they can drift with releases.
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
  `SP_SUPPORTED_ARCHITECTURES` = {Qwen3ForCausalLM} (Qwen3 dense; "other models reject
  --enable-layernorm-sp at construction"), prefill (EXTEND) only, tp_size > 1; server_args'
  validation also rejects DP attention with it. Earlier revisions only left SP off for other
  architectures; the memo follows the later, refusing one.
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
  pattern does not match, nothing changes and nothing is logged as an error. The pass applies only
  on CUDA GPUs with an entry in its tables (sm90: hidden >= 8192, 8 MiB per GPU; sm100 family:
  hidden >= 8192, 32 MiB per GPU; anything else, e.g. sm120, gets no SP) and to batches of at least
  min_per_gpu_MiB x tp / (hidden x element size) tokens (`get_sequence_parallelism_threshold`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
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

# Architectures SGLang's --enable-layernorm-sp accepts (layernorm_sp.py SP_SUPPORTED_ARCHITECTURES =
# {"Qwen3ForCausalLM"}), as the model_type of that architecture.
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


def _decisions(plan: Plan) -> tuple[object, ...]:
    """A plan's decisions without its name: what the engine would have to run."""
    d = plan.describe()
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def _references() -> dict[tuple[object, ...], str]:
    from tpplan.plans.named import baseline, input_scattered, latent_scattered, sequence_parallel, sp_moe

    refs = (
        ("baseline", baseline()),
        ("input-scattered", input_scattered()),
        ("latent-scattered", latent_scattered()),
        ("sequence-parallel", sequence_parallel()),
        ("sp-moe", sp_moe()),
    )
    return {_decisions(p): name for name, p in refs}


def _attn_side(patterns: frozenset[str]) -> list[str]:
    return sorted(r for r in patterns if "/moe." not in r and "/dense." not in r)


def _covered(names: frozenset[str], patterns: frozenset[str]) -> bool:
    """Every entry of `names` (exact roles or patterns) is one of, or matches one of, `patterns`."""
    return all(n in patterns or any(fnmatchcase(n, p) for p in patterns) for n in names)


def _is_sp_moe(plan: Plan) -> bool:
    """The decisions SGLang's SP-MoE / DeepEP path runs: attention input gathered, MoE all-to-all,
    only shared experts, router and latent projections replicated."""
    from tpplan.plans.named import sp_moe

    ref = sp_moe()
    return (
        plan.moe == "a2a"
        and (plan.stream, plan.reduce) == (ref.stream, ref.reduce)
        and not (plan.a2a or plan.gather_for or plan.token_shard)
        and _covered(plan.gather, ref.gather)
        and _covered(plan.replicate, ref.replicate)
    )


def family(plan: Plan) -> str:
    """The engine-level family of a plan, decided from its decisions, never from its name:
    two plans with the same decisions get the same engine verdict. A plan that matches no engine
    path (e.g. a search result mixing ideas per layer kind) is "custom": it needs code."""
    same = _references().get(_decisions(plan))
    if same is not None:
        return same
    if plan.moe == "ep":
        return "ep"
    if _is_sp_moe(plan):
        return "sp-moe"
    if plan.moe == "a2a" or plan.replicate or plan.a2a:
        return "custom"
    if plan.token_shard:
        return "latent-scattered"
    if plan.stream != plan.reduce or plan.gather:
        return "input-scattered+restore" if plan.gather_for else "input-scattered"
    return "baseline"


def _needs_code(plan: Plan) -> str:
    """What an engine would need to run a plan that replicates weights or all-to-alls outputs."""

    def ops(patterns: frozenset[str]) -> str:
        return ", ".join(f"`{o}`" for o in sorted({r.rsplit("/", 1)[-1] for r in patterns}))

    from tpplan.plans.named import input_scattered

    parts = []
    base = input_scattered()
    if (plan.stream, plan.reduce, plan.gather) == (base.stream, base.reduce, base.gather):
        parts.append("input-scattered")
    elif plan.gather:
        parts.append(f"all-gather the outputs of {ops(plan.gather)}")
    if plan.replicate:
        parts.append(f"replicate {ops(plan.replicate)} (run on local tokens)")
    if plan.a2a:
        parts.append(f"all-to-all the outputs of {ops(plan.a2a)} to head-sharded")
    return "needs code: " + "; ".join(parts or ["the plan's decisions"]) + "; no engine flag does this"


def sglang_recipe(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192
) -> EngineRecipe:
    """SGLang flags for `plan` on `spec` at TP `tp` (x PP `pp`) over `nodes` nodes."""
    fam = family(plan)
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
        restores = (gated or linear) and passes
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


# vLLM's sequence-parallelism gate (`get_sequence_parallelism_threshold` in SRC_VLLM_SP): per CUDA
# compute-capability family, the smallest hidden size and the smallest all-reduce per GPU (MiB) for
# which the pass applies; a capability without an entry (e.g. sm120, RTX PRO 6000) gets no SP.
VLLM_SP_MIN_HIDDEN = {90: 8192, 100: 8192}
VLLM_SP_MIN_MIB_PER_GPU = {90: 8, 100: 32}  # sm100 was 64 MiB in an earlier revision of the file


def gpu_capability(gpu: str) -> int | None:
    """CUDA compute-capability family (90, 100, 120) from a GPU's marketing name, when known."""
    name = gpu.upper()
    if "H100" in name or "H200" in name or "H20" in name:
        return 90
    if "B200" in name or "B300" in name or "GB200" in name:
        return 100
    if "RTX PRO 6000" in name or "RTX 50" in name:
        return 120
    return None


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


def recipes(
    plan: Plan, spec: ModelSpec, *, tp: int, pp: int = 1, nodes: int = 1, chunk: int = 8192, gpu: str = ""
) -> list[EngineRecipe]:
    """Both engines' recipes for one plan."""
    kw = {"tp": tp, "pp": pp, "nodes": nodes, "chunk": chunk}
    return [sglang_recipe(plan, spec, **kw), vllm_recipe(plan, spec, gpu=gpu, **kw)]


__all__ = ["Condition", "EngineRecipe", "recipes", "sglang_recipe", "vllm_recipe"]
