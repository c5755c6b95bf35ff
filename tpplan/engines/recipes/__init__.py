"""Server flags that realise a plan in SGLang and vLLM, judged against the engines' own code.

Every engine fact (what a flag does per model class, the per-layer dataflow, the gates with the
server arguments and environment variables behind them, the fallback, how PP is scheduled) lives
once, as versioned data with its sources, in the modules beside this package (docs/engines.md).
This package turns that data into launch lines, the conditions the report prints and one sentence
per engine on what it really runs for the model class at hand; the report imports it from here.
`engines` selects the versions (`--engine sglang@0.5.23`); the default is each engine's current
release (`tpplan.engines.default_release`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpplan.engines import Launch, default_release, select, select_pair
from tpplan.engines.context_parallel import SGLANG_K3_FULL_SEQUENCE
from tpplan.engines.launch import DeploymentFlags, deployment_flags, size_flags
from tpplan.engines.recipes.base import BLOCKING, Condition, EngineRecipe, family, gpu_capability
from tpplan.engines.recipes.sglang import sglang_recipe
from tpplan.engines.recipes.vllm import vllm_recipe
from tpplan.engines.redundant_experts import launch_flags as redundant_flags
from tpplan.engines.routing import replica_router, router_note
from tpplan.engines.schema import EngineVersion
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.spec import MLASpec, ModelSpec


def recipes(
    plan: Plan,
    launch: Launch,
    *,
    prefill_cp: int = 1,
    engines: tuple[EngineVersion, EngineVersion] | None = None,
) -> list[EngineRecipe]:
    """Both engines' recipes for one plan at one launch: its model, its deployment (`launch.mesh`: TP, PP, CP and
    its layers, replicas), vLLM's data-parallel size `launch.dp`, its nodes, chunk and GPU; `prefill_cp` is
    SGLang's prefill context parallelism the gates read; `engines` the (SGLang, vLLM) versions. Each recipe
    realises the whole deployment or says why no flag does (`whole_deployment`)."""
    sgl, vll = engines or select_pair(None)
    spec, d = launch.spec, launch.mesh
    sizes = Mesh(d.tp, pp=d.pp, cp=d.cp if d.cp_layers == "all" else 1)  # what the plan's flags size
    first = max(prefill_cp, d.cp)  # SGLang's prefill CP: the deployment's, or the larger one asked for
    out = [
        sglang_recipe(
            plan, spec, sizes, nodes=launch.nodes, chunk=launch.chunk, gpu=launch.gpu, prefill_cp=first, engine=sgl
        ),
        vllm_recipe(plan, replace(launch, mesh=sizes), engine=vll),
    ]
    out = [r if r.version else replace(r, version=ev.key) for r, ev in zip(out, (sgl, vll), strict=True)]
    return [whole_deployment(r, plan, spec, d, launch.nodes) for r in out]


@dataclass(frozen=True)
class Launchers:
    """Which engine releases launch one deployment (`launches`: a command line and no condition stopping it, as
    the memo's launch lines print it), and why each other does not: "needs code" where none does."""

    by: tuple[str, ...]  # "SGLang 0.5.23", ...
    why_not: tuple[str, ...]  # "vLLM 0.34.0: needs code: ...", one per release that does not

    @property
    def needs_code(self) -> bool:
        return not self.by

    def merged(self, other: Launchers) -> Launchers:
        """Both pools' launchers (a P/D deployment): the releases launching each pool, every reason kept."""
        return Launchers(tuple(e for e in self.by if e in other.by), tuple(dict.fromkeys(self.why_not + other.why_not)))


def launches(r: EngineRecipe) -> bool:
    """Whether the engine launches the deployment with `r`: its flags realise it (whole or in part) and no condition
    makes the engine refuse, skip or stop it; else the launch line says "needs code" (`EngineRecipe.summary`)."""
    return r.realises != "no" and not r.blocked


def why_not_launched(r: EngineRecipe) -> str:
    """Why the engine does not launch the deployment with `r` ("" where it does): no flag realises it (the
    recipe's summary, "needs code: ..."), or a condition it fails makes the engine refuse, skip or stop it."""
    if r.realises == "no":
        return r.summary
    stops = [f"{c.text} fails (the engine {c.effect})" for c in r.conditions if c.met is False and c.effect in BLOCKING]
    return "; ".join(stops)


def release_name(r: EngineRecipe) -> str:
    """`SGLang 0.5.23`: the recipe's engine and release, as the launch lines name them."""
    return f"{r.engine} {r.version.partition('@')[2]}".strip()


def launchers(plan: Plan, launch: Launch, engines: tuple[EngineVersion, EngineVersion] | None = None) -> Launchers:
    """The engine releases (`engines`, default each engine's current) that launch `plan` at `launch`'s deployment
    (`recipes`, held to the whole deployment: its CP, replicas and their router), and why the others do not."""
    got = recipes(plan, launch, engines=engines)
    return Launchers(
        tuple(release_name(r) for r in got if launches(r)),
        tuple(f"{release_name(r)}: {why_not_launched(r)}" for r in got if not launches(r)),
    )


def _deployment_flags(engine: str, plan: Plan, spec: ModelSpec, d: Mesh, version: str | None) -> DeploymentFlags:
    """The engine's flags for the deployment's sizes, CP, replicas and overlap (`engines.launch`), or why none."""
    if d.cp > 1 and d.cp_layers == "mla":  # CP inside the TP group: only an open SGLang PR has it
        path = SGLANG_K3_FULL_SEQUENCE
        why = f"CP inside the TP group (--cp-layers mla) is {path.engine}, in no release"
        return DeploymentFlags(engine, (), why, path.sources[0].cite())
    if plan.dp_attention and (d.pp > 1 or d.cp > 1):
        missing = _dp_beside_missing(engine, d, version)
        if missing is not None:
            return DeploymentFlags(engine, (), missing, "")
    all_mla = all(isinstance(layer.attn, MLASpec) for layer in spec.layers)
    return deployment_flags(engine, spec.model_type, all_mla, d, plan.overlap, version)


def _dp_beside_missing(engine: str, d: Mesh, version: str | None) -> str | None:
    """Why no flag realises DP attention beside the mesh's PP or CP in this engine version (None: its flags do, as
    its release module read: `EngineVersion.dp_attention_beside`)."""
    ev = select(version) if version else default_release(engine)
    read = ev.dp_attention_beside
    if read is None:
        return f"tpplan's engine data has not read DP attention beside PP or CP for {ev.key}"
    missing = [axis for axis, size, ok in (("PP", d.pp, read.pp), ("CP", d.cp, read.cp)) if size > 1 and not ok]
    if missing:
        return f"needs code: {ev.engine} {ev.version} does not run DP attention beside {' or '.join(missing)}"
    return None


def whole_deployment(r: EngineRecipe, plan: Plan, spec: ModelSpec, d: Mesh, nodes: int = 1) -> EngineRecipe:
    """`r` (the plan's flags at the deployment's sizes) held to the whole deployment: no flag where the engine
    does not run its CP, overlap or CP mode (the reason said), else its overlap and redundant-expert flags added
    and its replicas (the deployment's request router: `tpplan.engines.routing`, on `nodes` nodes) and CP
    difference noted."""
    flags = _deployment_flags(r.engine, plan, spec, d, r.version or None)
    try:  # the deployment's request router, as the serving loop runs it (`tpplan.engines.routing`)
        router = replica_router(r.version, d.router) if d.replicas > 1 and r.version else None
    except TpplanError as err:  # a router this engine version does not have
        flags = DeploymentFlags(r.engine, (), f"{err.where} is not one of {r.version}'s request routers", "")
        router = None
    if not flags.realised:
        if r.realises == "no":
            return replace(r, summary=f"{r.summary}; and {flags.why}", replicas=d.replicas)
        return replace(r, realises="no", summary=flags.why, replicas=d.replicas)
    extra = (*flags.args[len(size_flags(r.engine, d)) :], *redundant_flags(r.engine, plan.redundant_experts))
    args = r.args if r.realises == "no" else (*r.args, *(a for a in extra if a not in r.args))
    note = router_note(router, spec, nodes)
    return replace(r, args=args, replicas=d.replicas, router=router, router_note=note, deployment_note=flags.why)


__all__ = [
    "Condition",
    "EngineRecipe",
    "Launchers",
    "family",
    "gpu_capability",
    "launchers",
    "launches",
    "recipes",
    "release_name",
    "sglang_recipe",
    "vllm_recipe",
    "whole_deployment",
    "why_not_launched",
]
