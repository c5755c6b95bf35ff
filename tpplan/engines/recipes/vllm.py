"""vLLM launch lines per plan, judged against the engine data (`tpplan.engines.vllm`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpplan.engines import Launch, default_release, judge, path_for
from tpplan.engines import vllm as vllm_data
from tpplan.engines.launch import size_flags
from tpplan.engines.recipes.base import Condition, EngineRecipe, _moe, _needs_code, family, path_sentence
from tpplan.engines.schema import EngineVersion, Source
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh

SRC_PAR = Source(vllm_data.REPO, "vllm/config/parallel.py", "ParallelConfig", vllm_data.REL)


def _pp_condition(ev: EngineVersion, model_type: str) -> Condition:
    """Whether the model's vLLM class implements SupportsPP (else --pipeline-parallel-size is refused)."""
    read = ev.support("--pipeline-parallel-size", model_type)
    if read is not None:
        text = f"the model's vLLM class supports --pipeline-parallel-size ({model_type}: {read.how})"
        return Condition(text, read.runs, "refuses", read.source.cite())
    unread = Source.unread(
        vllm_data.REPO,
        "vllm/model_executor/models/",
        "SupportsPP",
        why="this engine version's data has no record for the model type (0.33.0 and 0.34.0 have one for every "
        "tpplan preset's; a main revision's records are not read)",
    )
    return Condition(f"the model's vLLM class supports --pipeline-parallel-size ({model_type} not checked)", None,
                     "refuses", unread.cite())  # fmt: skip


def vllm_recipe(plan: Plan, launch: Launch, *, engine: EngineVersion | None = None) -> EngineRecipe:
    """vLLM flags for `plan` on the launch's model at its mesh's TP (x CP x PP, x its `dp`, vLLM's data-parallel
    size) over its nodes of its GPU, judged against `engine` (default: the engine's default release); with PP,
    whether the model class supports it."""
    spec, mesh = launch.spec, launch.mesh
    ev = engine or default_release("vLLM")
    if plan.dp_attention:
        from tpplan.engines.recipes.dp_attention import vllm_dp_recipe

        r = vllm_dp_recipe(plan, spec, mesh, launch.chunk, ev.dp_attention_beside)
    else:
        r = _family_recipe(ev, plan, launch)
    if mesh.pp == 1 or not r.args:
        return r
    return replace(r, conditions=(_pp_condition(ev, spec.model_type), *r.conditions))


def _family_recipe(ev: EngineVersion, plan: Plan, launch: Launch) -> EngineRecipe:
    """The flags for the plan's family, judged against `ev` (vllm_recipe adds the PP condition)."""
    mesh, chunk = launch.mesh, launch.chunk
    tp = mesh.tp
    d = replace(launch, mesh=Mesh(tp, pp=mesh.pp))  # what the gates read: TP and PP
    fam = family(plan)
    base = size_flags("vLLM", mesh)
    base += ["--enable-chunked-prefill", f"--max-num-batched-tokens {chunk}"]
    if launch.nodes > 1:
        base.append("--distributed-executor-backend ray")
    kw: dict[str, Any] = {"version": ev.key, "launcher": ev.launcher}
    if fam == "sglang-sp-moe":
        return EngineRecipe(
            "vLLM", plan.name, tuple(base), "no",
            "no vLLM flag all-gathers the stream before the input norm under MoE all-to-all (SGLang's default K3 "
            "SP-MoE); vLLM's MoE sequence parallelism norms on the rank's rows (`sp-moe`)", **kw,
        )  # fmt: skip
    if fam in ("sp-moe", "vllm-moe-chunk"):
        return _moe_sp(ev, plan, d, base, kw)
    if fam == "ep":
        return EngineRecipe(
            "vLLM", plan.name, (*base, "--enable-expert-parallel"), "partly",
            f"vLLM's EP size is TP x DP ({tp}), not {plan.ep_size}: EP{plan.ep_size} inside TP{tp} has no flag",
            (Condition("EP size equals TP x DP", plan.ep_size == tp, "adjusts", SRC_PAR.cite()),), **kw,
        )  # fmt: skip
    if fam == "sequence-parallel":
        return _sp_pass(ev, plan, d, base, kw)
    if fam == "custom":
        return EngineRecipe("vLLM", plan.name, tuple(base), "no", _needs_code(plan), **kw)
    if fam in (
        "sglang-input-scattered",
        "input-scattered",
        "input-scattered+restore",
        "latent-scattered",
        "gate-aware",
    ):
        return EngineRecipe(
            "vLLM", plan.name, tuple(base), "no", "vLLM has no input-scattered attention path; needs code", **kw
        )
    return EngineRecipe("vLLM", plan.name, tuple(base), "yes", "Megatron TP (the default)", **kw)


def _moe_sp(ev: EngineVersion, plan: Plan, d: Launch, base: list[str], kw: dict[str, Any]) -> EngineRecipe:
    """vLLM's expert parallelism with MoE sequence parallelism: whether the model class wires it, its gates
    hold, and its dataflow is this plan's."""
    mode = ev.mode("moe-sp")
    assert mode is not None
    spec = d.spec
    path = path_for(mode, spec)
    conds = (
        Condition("the model has routed experts", _moe(spec) is not None, "refuses", SRC_PAR.cite()),
        *(Condition.of(r) for r in judge(mode, d)),
    )
    dp_args = (f"--data-parallel-size {d.dp}",) if d.dp > 1 else ()
    args = (*base, *dp_args, *mode.flags)
    on = all(c.met is not False for c in conds)
    w = path.wiring
    if w is None:
        summary = f"expert parallel; {spec.model_type} does not wire MoE sequence parallelism"
    elif w.plan == plan.name:
        summary = f"{mode.summary} ({w.layers})" if on else (
            "expert parallel, but MoE sequence parallelism is off (a gate fails): every TP rank dispatches the "
            "whole replicated batch"
        )  # fmt: skip
    else:
        summary = f"expert parallel with MoE sequence parallelism, but not this plan's dataflow ({w.layers})"
    return EngineRecipe(
        "vLLM", plan.name, args, "partly", summary, conds, w.differences if w else (),
        path=path_sentence(ev, "MoE sequence parallelism", spec, path), **kw,
    )  # fmt: skip


def _sp_pass(ev: EngineVersion, plan: Plan, d: Launch, base: list[str], kw: dict[str, Any]) -> EngineRecipe:
    """vLLM's sequence-parallelism compile pass: absent in this version, blocked by a gate, or its flags."""
    mode = ev.mode("sp-pass")
    assert mode is not None
    conds = tuple(Condition.of(r) for r in judge(mode, d))
    if not mode.exists:
        return EngineRecipe(
            "vLLM", plan.name, tuple(base), "no",
            f"vLLM {ev.version} has no sequence-parallelism compile pass ({mode.gates[0].source.cite()})",
            conds, path=f"vLLM {ev.version}: {mode.gates[0].text} ({mode.gates[0].source.cite()}).", **kw,
        )  # fmt: skip
    path = path_for(mode, d.spec)
    blocked = any(c.met is False for c in conds)
    return EngineRecipe(
        "vLLM", plan.name, (*base, *mode.flags), "no" if blocked or not path.wired else "yes",
        mode.summary, conds, path=path_sentence(ev, "the sequence-parallelism pass", d.spec, path), **kw,
    )  # fmt: skip
