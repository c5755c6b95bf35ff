"""Shared pieces of the engine recipes: the condition and recipe types, the plan's engine family
(decided from its decisions), and the GPU generation from its name. Sources: see the package
docstring (`tpplan/report/engines/__init__.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from tpplan.layout.plan import Plan
from tpplan.models.spec import MLASpec, ModelSpec, MoESpec

# What the engine does when a condition fails: "refuses" (the server does not start), "skips
# silently" (it starts and runs the all-reduce path), "falls back" (it runs the same collectives on
# a slower path, e.g. NCCL instead of a fused kernel: the plan runs, only its speed changes),
# "adjusts" (it changes another setting), "keep" (a setting outside the plan to leave as stated).
Effect = Literal["refuses", "skips silently", "falls back", "adjusts", "keep"]

SRC_SGL_ATTN = "sgl-project/sglang python/sglang/srt/layers/communicator/adapters/attention.py"
SRC_SGL_ARGS = "sgl-project/sglang python/sglang/srt/server_args.py"
SRC_SGL_COMM = "sgl-project/sglang python/sglang/srt/layers/communicator/__init__.py"
SRC_SGL_SP = "sgl-project/sglang python/sglang/srt/layers/layernorm_sp.py"
SRC_SGL_CONSTR = "sgl-project/sglang python/sglang/srt/layers/communicator/construction.py"
SRC_SGL_LACP = "sgl-project/sglang python/sglang/srt/arg_groups/linear_attn_cp_hook.py"
SRC_SGL_K3SP = "sgl-project/sglang python/sglang/srt/layers/k3_sp_collective.py"
SRC_VLLM_MOE = "vllm-project/vllm vllm/model_executor/models/nemotron_h.py"
SRC_VLLM_PAR = "vllm-project/vllm vllm/config/parallel.py"
SRC_VLLM_SP = "vllm-project/vllm vllm/compilation/passes/fusion/sequence_parallelism.py"


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
    if plan.dp_attention:
        from tpplan.report.engines.dp_attention import dp_family

        return dp_family(plan) or "custom"
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


def gpu_sm(gpu: str) -> int | None:
    """CUDA compute capability (90, 100, 103, 120) from a GPU's marketing name, when known."""
    name = gpu.upper()
    if "H100" in name or "H200" in name or "H20" in name:
        return 90
    if "B300" in name:  # also GB300
        return 103
    if "B200" in name:  # also GB200
        return 100
    if "RTX PRO 6000" in name or "RTX 50" in name:
        return 120
    return None


def gpu_capability(gpu: str) -> int | None:
    """CUDA compute-capability family (90, 100, 120): sm103 (B300) belongs to the sm100 family."""
    sm = gpu_sm(gpu)
    return 100 if sm == 103 else sm
