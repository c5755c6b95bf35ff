"""Shared pieces of the engine recipes: the condition and recipe types, the plan's engine family
(decided from its decisions), and the GPU generation from its name. Every engine fact comes from
the versioned engine data (`tpplan.engines`); this package only turns it into launch lines and
report sentences."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from tpplan.engines import GateResult, Path
from tpplan.engines.gates import gpu_sm
from tpplan.engines.routing import launch_header
from tpplan.engines.schema import Effect, EngineVersion, ReplicaRouter
from tpplan.layout.plan import Plan
from tpplan.models.spec import MLASpec, ModelSpec, MoESpec

# Effects that stop a plan: the server refuses, runs the all-reduce path instead, or stops on an assertion.
BLOCKING: tuple[Effect, ...] = ("refuses", "runs baseline", "asserts")


@dataclass(frozen=True)
class Condition:
    """One gate of the engine data, decided for this model and deployment (met None: keep it)."""

    text: str
    met: bool | None
    effect: Effect
    source: str

    def line(self) -> str:
        """One line for the report."""
        mark = {True: "ok", False: "FAILS", None: "keep"}[self.met]
        return f"[{mark}] {self.text} (if not: {self.effect}; {self.source})"

    @classmethod
    def of(cls, r: GateResult) -> Condition:
        text = r.gate.text + (f" (here: {r.detail})" if r.detail else "")
        return cls(text, r.met, r.gate.effect, r.gate.source.cite())


@dataclass(frozen=True)
class EngineRecipe:
    """The flags for one engine version and plan, and what could stop them from doing what they say.
    `path` is what the engine does with the flag on this model class, in one sentence with its
    source (the memo puts it before legality and volumes)."""

    engine: str
    plan: str
    args: tuple[str, ...]
    realises: Literal["yes", "partly", "no"]
    summary: str
    conditions: tuple[Condition, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    version: str = ""
    path: str = ""
    env: tuple[str, ...] = ()  # environment variables the launch line sets (NAME=value)
    launcher: str = ""
    replicas: int = 1  # the deployment's replicas, spread by `router` (`launch_header`: one server or R)
    router: ReplicaRouter | None = None  # what spreads the requests over them (`tpplan.engines.routing`)
    router_note: str = ""  # what the router's flags do otherwise on this model (`routing.router_note`)
    deployment_note: str = ""  # where the engine runs the deployment (e.g. its CP) otherwise than tpplan prices it

    def flags_text(self) -> str:
        """The flags every replica's launch takes, in backticks, and what spreads the requests over the replicas
        (the request router's flags among them where it is in-process: `routing.launch_header`)."""
        args, spread = launch_header(self.router, self.replicas, self.args, self.router_note)
        return f"`{' '.join(args)}`" + (f" ({spread})" if spread else "")

    @property
    def blocked(self) -> bool:
        """True when a condition this model/plan fails makes the engine refuse, skip or stop the plan."""
        return any(c.met is False and c.effect in BLOCKING for c in self.conditions)

    def command(self, model_path: str = "<model-path>") -> str:
        """The launch command line (multi-node placeholders in angle brackets)."""
        if self.realises == "no":
            return ""
        head = (self.launcher or "python -m sglang.launch_server --model-path {model}").format(model=model_path)
        args, spread = launch_header(self.router, self.replicas, self.args, self.router_note)
        line = " ".join([*self.env, head, *args])
        return f"# {spread}:\n{line}" if spread else line

    @property
    def runs(self) -> bool:
        """An engine runs the plan at its deployment as is: its flags realise it and no condition stops them."""
        return self.realises == "yes" and not self.blocked

    def line(self) -> str:
        """One launch line for a deployment row: the flags (every replica's), or why there are none."""
        name = f"{self.engine} {self.version.partition('@')[2]}".strip()
        if self.realises == "no":
            return f"{name}: no engine flag ({self.summary})"
        args, spread = launch_header(self.router, self.replicas, self.args, self.router_note)
        tail = "" if self.realises == "yes" else f" (realises it only partly: {self.summary})"
        if self.blocked:
            tail += " (a condition fails: Engine flags)"
        note = f" ({self.deployment_note})" if self.deployment_note else ""
        each = f"{spread}: " if spread else ""
        return f"{name}: {each}`{' '.join((*self.env, *args))}`{tail}{note}"


def path_sentence(ev: EngineVersion, flag: str, spec: ModelSpec, path: Path) -> str:
    """What `ev` does with `flag` on this model class, in one sentence with its source."""
    if path.wiring is not None:
        w = path.wiring
        return (
            f"{ev.engine} {ev.version} wires {flag} for {spec.model_type} ({', '.join(w.architectures) or 'see data'}; "
            f"{w.layers}; {w.source.cite()})."
        )
    nw = path.not_wired
    assert nw is not None
    head = f"{ev.engine} {ev.version} does not wire {flag} for {spec.model_type}"
    if nw.runs == "refused":
        return f"{head}: the server refuses to start, because {nw.why} ({nw.source.cite()})."
    runs = "the all-reduce baseline" if nw.runs == "baseline" else f"`{nw.runs}`"
    return f"{head}: it runs {runs}, because {nw.why} ({nw.source.cite()})."


def _mla(spec: ModelSpec) -> MLASpec | None:
    return next((layer.attn for layer in spec.layers if isinstance(layer.attn, MLASpec)), None)


def _moe(spec: ModelSpec) -> MoESpec | None:
    return next((layer.mlp for layer in spec.layers if isinstance(layer.mlp, MoESpec)), None)


def _decisions(plan: Plan) -> tuple[object, ...]:
    """A plan's decisions without its name: what the engine would have to run."""
    d = plan.describe()
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def _references() -> dict[tuple[object, ...], str]:
    from tpplan.plans.named import (
        baseline,
        input_scattered,
        latent_scattered,
        sequence_parallel,
        sglang_input_scattered,
        sglang_sp_moe,
        sp_moe,
        vllm_moe_chunk,
    )

    refs = (
        ("baseline", baseline()),
        ("sglang-input-scattered", sglang_input_scattered()),
        ("sglang-sp-moe", sglang_sp_moe()),
        ("vllm-moe-chunk", vllm_moe_chunk()),
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


def dp_family(plan: Plan) -> str | None:
    """The DP-attention family of a plan (None: not a DP plan), from its decisions."""
    if not plan.dp_attention:
        return None
    if plan.moe == "a2a":
        return "dp-attention+a2a"
    if plan.gather_for and not plan.gather:  # only the experts see every rank's tokens
        return "vllm-dp-ep" if plan.moe == "ep" else "vllm-dp"
    if plan.moe == "ep":
        return "dp-attention+ep"
    return "dp-attention" if plan.dp_attention == "sum_len" else "dp-attention-maxlen"


def family(plan: Plan) -> str:
    """The engine-level family of a plan, decided from its decisions, never from its name:
    two plans with the same decisions get the same engine verdict. A plan that matches no engine
    path (e.g. a search result mixing ideas per layer kind) is "custom": it needs code."""
    same = _references().get(_decisions(plan))
    if same is not None:
        return same
    if plan.dp_attention:
        return dp_family(plan) or "custom"
    if plan.moe == "ep":  # EP without all-to-all runs by flag only on the baseline's stream and reductions
        plain = not (plan.replicate or plan.a2a or plan.gather or plan.gather_for or plan.token_shard or plan.fold)
        return "ep" if plain and plan.stream == plan.reduce else "custom"
    if _is_sp_moe(plan):
        return "sp-moe"
    if plan.moe == "a2a" or plan.replicate or plan.a2a:
        return "custom"
    if plan.token_shard:
        return "latent-scattered"
    if plan.fold:
        return "custom"
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


def gpu_capability(gpu: str) -> int | None:
    """CUDA compute-capability family (90, 100, 120): sm103 (B300) belongs to the sm100 family."""
    sm = gpu_sm(gpu)
    return 100 if sm == 103 else sm
