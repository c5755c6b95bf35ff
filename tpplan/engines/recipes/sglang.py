"""SGLang launch lines per plan, judged against the engine data (`tpplan.engines.sglang`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpplan.engines import Launch, default_release, judge, path_for
from tpplan.engines.launch import size_flags
from tpplan.engines.recipes.base import Condition, EngineRecipe, _moe, _needs_code, family, path_sentence
from tpplan.engines.schema import EngineVersion, Mode, Source, Wiring
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.spec import ModelSpec

FLAG = "--enable-attn-tp-input-scattered"
SRC_ARGS = Source(
    "sgl-project/sglang", "python/sglang/srt/server_args.py", "_handle_a2a_moe / ServerArgs", "0.5.23 (PyPI wheel)"
)


def _base(mesh: Mesh, chunk: int, nodes: int) -> list[str]:
    base = size_flags("SGLang", mesh)  # --tp-size is the world size under CP (engines/launch.py)
    base.append(f"--chunked-prefill-size {chunk}")
    if nodes > 1:
        base += [f"--nnodes {nodes}", f"--node-rank <0..{nodes - 1}>", "--dist-init-addr <head-ip>:<port>"]
    return base


def _conditions(mode: Mode, d: Launch) -> tuple[Condition, ...]:
    return tuple(Condition.of(r) for r in judge(mode, d))


def _input_scattered(ev: EngineVersion, plan: Plan, fam: str, d: Launch, base: list[str]) -> EngineRecipe:
    mode = ev.mode("input-scattered")
    assert mode is not None
    path = path_for(mode, d.spec)
    sentence = path_sentence(ev, FLAG, d.spec, path)
    conds = _conditions(mode, d)
    args = (*base, *mode.flags)
    common: dict[str, Any] = {"version": ev.key, "path": sentence, "launcher": ev.launcher, "conditions": conds}
    if fam == "sglang-input-scattered" and path.wiring is not None:
        return EngineRecipe("SGLang", plan.name, args, "yes", mode.summary, notes=path.wiring.differences, **common)
    if not path.wired:
        return EngineRecipe(
            "SGLang", plan.name, tuple(base), "no",
            f"{FLAG} does nothing on {d.spec.model_type} (the engine runs the all-reduce baseline)", **common,
        )  # fmt: skip
    return EngineRecipe(
        "SGLang", plan.name, tuple(base), "no",
        f"no SGLang flag runs this plan; {FLAG} runs `{path.runs_plan}` on {d.spec.model_type} ({mode.summary})",
        **common,
    )  # fmt: skip


def _sp_moe(ev: EngineVersion, plan: Plan, d: Launch, base: list[str]) -> EngineRecipe:
    """`--moe-a2a-backend deepep` on this model class: the wiring SGLang runs by default (its first),
    whether this plan is that path, the K3 norm-on-shard variant, or neither."""
    mode = ev.mode("sp-moe")
    assert mode is not None
    conds = _conditions(mode, d)
    args = (*base, *mode.flags)
    common: dict[str, Any] = {"version": ev.key, "launcher": ev.launcher, "conditions": conds}
    mt = d.spec.model_type
    wired = [w for w in mode.wiring if mt in w.model_types]
    if not wired:
        return _sp_moe_unwired(ev, mode, plan, d, base, args, common)
    equal = next((w for w in wired if w.plan == plan.name), None)
    default = wired[0]
    sentence, nccl = _sp_moe_sentence(ev, mode, d, default)
    if equal is default:
        return EngineRecipe(
            "SGLang", plan.name, args, "yes", mode.summary, notes=default.differences, path=sentence, **common
        )
    if equal is not None and not nccl:
        return EngineRecipe(
            "SGLang", plan.name, args, "partly",
            f"{mode.summary}; this plan is SGLang's {equal.layers} path (set the environment variable)",
            notes=equal.differences, path=sentence, env=("SGLANG_K3_SP_ATTN_RES=1",), **common,
        )  # fmt: skip
    if equal is not None:
        return EngineRecipe(
            "SGLang", plan.name, args, "partly",
            f"{mode.summary}; this plan's norm-on-shard attention input needs the fused SP collectives, which this "
            f"GPU/TP does not have: SGLang runs its default path `{default.plan}` instead",
            notes=equal.differences, path=sentence, **common,
        )  # fmt: skip
    return EngineRecipe(
        "SGLang", plan.name, args, "partly",
        f"{mode.summary}; SGLang runs `{default.plan}` on {mt}, not this plan's dataflow", path=sentence, **common,
    )  # fmt: skip


def _sp_moe_unwired(
    ev: EngineVersion, mode: Mode, plan: Plan, d: Launch, base: list[str], args: tuple[str, ...], common: dict
) -> EngineRecipe:
    """SP-MoE on a model class no wiring names: what the engine runs instead where that was read, else the
    flags with the dataflow marked unread."""
    mt = d.spec.model_type
    path = path_for(mode, d.spec)
    nw = path.not_wired
    if nw is not None and nw.source.read:
        return EngineRecipe(
            "SGLang", plan.name, tuple(base), "no", f"--moe-a2a-backend deepep does nothing on {mt} ({nw.why})",
            path=path_sentence(ev, "SP-MoE", d.spec, path), **common,
        )  # fmt: skip
    return EngineRecipe(
        "SGLang", plan.name, args, "partly",
        "DeepEP dispatch/combine; the engine data has no transcribed per-layer dataflow of "
        f"--moe-a2a-backend deepep for {mt} (source: unread)",
        path=f"SGLang {ev.version}: --moe-a2a-backend deepep on {mt} is not transcribed in tpplan's "
        "engine data (source: unread).",
        **common,
    )  # fmt: skip


def _sp_moe_sentence(ev: EngineVersion, mode: Mode, d: Launch, default: Wiring) -> tuple[str, bool]:
    """The sentence naming the default path's dataflow and, for K3, whether its reduce-scatter and
    all-gather run on the fused SP collectives or on NCCL here; and whether on NCCL."""
    fused_gates = [r for r in judge(mode, d) if (r.gate.check or "").startswith("k3_sp_collective")]
    fused = next((r for r in fused_gates if r.met is False), fused_gates[0] if fused_gates else None)
    nccl = fused is not None and fused.met is False
    how = (
        f"; here its reduce-scatter and all-gather run on NCCL, not K3's fused SP collectives ({fused.detail} "
        f"fails their gate; {fused.gate.source.cite()})"
        if nccl and fused is not None
        else ""
    )
    sentence = (
        f"SGLang {ev.version} wires SP-MoE for {d.spec.model_type} ({default.source.cite()}): by default it runs "
        f"`{default.plan}` on {default.layers}, per layer: {default.steps_text()}{how}."
    )
    return sentence, nccl


def _pp_condition(ev: EngineVersion, model_type: str) -> Condition:
    """Whether the model's SGLang class runs --pp-size: read per model file where the engine data has it (every
    tpplan model type in 0.5.23; the release refuses it for some, `Support.runs`)."""
    read = ev.support("--pp-size", model_type)
    if read is not None:
        return Condition(f"the model's SGLang implementation supports --pp-size ({model_type}: {read.how})", read.runs,
                         "refuses", read.source.cite())  # fmt: skip
    unread = Source.unread(
        "sgl-project/sglang",
        "python/sglang/srt/models/",
        "PP support",
        why="this engine version's data has no record for the model type (sglang@0.5.23 has one for every tpplan "
        "preset's; a main revision's records are not read)",
    )
    return Condition(f"the model's SGLang implementation supports --pp-size ({model_type} not checked)", None,
                     "refuses", unread.cite())  # fmt: skip


def sglang_recipe(
    plan: Plan,
    spec: ModelSpec,
    mesh: Mesh,
    *,
    nodes: int = 1,
    chunk: int = 8192,
    gpu: str = "",
    engine: EngineVersion | None = None,
    prefill_cp: int | None = None,
) -> EngineRecipe:
    """SGLang flags for `plan` on `spec` at the mesh's TP (x CP x PP) over `nodes` nodes of `gpu`, judged
    against `engine` (default: the current release); `prefill_cp` is the prefill CP the gates read (default
    the mesh's; `tpplan report --prefill-cp` sets it for a server that runs CP beside this deployment)."""
    ev = engine or default_release("SGLang")
    d = Launch(spec, Mesh(mesh.tp, pp=mesh.pp, cp=prefill_cp or mesh.cp), 1, chunk, gpu, nodes)
    base = _base(mesh, chunk, nodes)
    if plan.dp_attention:
        from tpplan.engines.recipes.dp_attention import sglang_dp_recipe

        return sglang_dp_recipe(plan, spec, base, mesh)
    fam = family(plan)
    r = _family_recipe(ev, plan, fam, d, base)
    if mesh.pp == 1 or fam in NO_FLAG:
        return r
    return replace(r, conditions=(_pp_condition(ev, spec.model_type), *r.conditions))


# Families no SGLang flag runs: their line names no flag, so no condition of a flag's.
NO_FLAG = ("vllm-moe-chunk", "latent-scattered", "gate-aware", "custom")


def _family_recipe(ev: EngineVersion, plan: Plan, fam: str, d: Launch, base: list[str]) -> EngineRecipe:
    """The flags for the plan's engine family, judged against `ev` (sglang_recipe adds the PP condition)."""
    kw: dict[str, Any] = {"version": ev.key, "launcher": ev.launcher}
    moe = _moe(d.spec)
    if fam in ("sglang-input-scattered", "input-scattered", "input-scattered+restore"):
        return _input_scattered(ev, plan, fam, d, base)
    if fam in ("sp-moe", "sglang-sp-moe"):
        return _sp_moe(ev, plan, d, base)
    if fam == "vllm-moe-chunk":
        return EngineRecipe(
            "SGLang", plan.name, tuple(base), "no",
            "no SGLang flag keeps the attention all-reduce and all-gathers a chunked MoE's output (vLLM's "
            "Qwen3-MoE path); --moe-a2a-backend deepep runs `sp-moe`", **kw,
        )  # fmt: skip
    if fam == "ep" and moe is not None:
        ep = plan.ep_size or d.tp
        return EngineRecipe(
            "SGLang", plan.name, (*base, f"--ep-size {ep}", "--moe-a2a-backend none"), "yes",
            f"expert parallelism without all-to-all: {moe.experts // ep} experts per EP group of {d.tp // ep} ranks",
            (Condition("ep_size divides tp_size", d.tp % ep == 0, "refuses", SRC_ARGS.cite()),), **kw,
        )  # fmt: skip
    if fam == "sequence-parallel":
        mode = ev.mode("layernorm-sp")
        assert mode is not None
        path = path_for(mode, d.spec)
        ok = path.wired and path.runs_plan == plan.name
        return EngineRecipe(
            "SGLang", plan.name, (*base, *mode.flags), "yes" if ok else "no", mode.summary, _conditions(mode, d),
            path=path_sentence(ev, "--enable-layernorm-sp", d.spec, path), **kw,
        )  # fmt: skip
    if fam in NO_FLAG:
        why = (
            "no SGLang flag token-shards only the latent GEMM (a research prototype)"
            if fam == "latent-scattered"
            else _needs_code(plan)
        )
        return EngineRecipe("SGLang", plan.name, tuple(base), "no", why, **kw)
    args = [*base, "--moe-a2a-backend none"] if moe is not None else base
    return EngineRecipe(
        "SGLang", plan.name, tuple(args), "yes", "Megatron TP: all-reduce after o_proj and MLP/MoE", **kw
    )
