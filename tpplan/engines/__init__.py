"""Engine knowledge as versioned data: what SGLang and vLLM really run for a flag, per model class.

`ENGINES` holds every engine version read, one module each in `tpplan.engines.releases` (built from the
records of `tpplan.engines.sglang` and `tpplan.engines.vllm`; the schema is `tpplan.engines.schema`), each
with its scheduler rules, KV sizing and P/D hand-off. `select("sglang@0.5.23")` picks one; an engine's
default is its newest release (`default_release`; `DEFAULT_ENGINES` at import). `scheduler_rules`,
`kv_sizing` and `handoff_rule` read a version's serving facts. `path_for(engine, mode, spec)` says which model
class wiring applies to a model, or that the model class does not wire the mode and what the engine
runs instead; `judge` decides a mode's gates for a deployment. Planner-level: no torch, no report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpplan.engines.gates import Launch, evaluate, mla_of
from tpplan.engines.releases import collect, discovered, ordered
from tpplan.engines.schema import (
    Comm,
    EngineVersion,
    Gate,
    HandoffRule,
    KVSizing,
    MicroBatchOverlap,
    Mode,
    NotWired,
    Op,
    SchedulerRules,
    Source,
    Wiring,
)
from tpplan.errors import TpplanError
from tpplan.models.spec import ModelSpec, MoESpec

# One module per version in `engines/releases/`, each engine's newest release first.
ENGINES: dict[str, EngineVersion] = collect(ordered(discovered()))
ENGINE_NAMES = ("SGLang", "vLLM")  # the (SGLang, vLLM) order of `select_pair` and `DEFAULT_ENGINES`


def default_release(engine: str) -> EngineVersion:
    """`engine`'s ("SGLang", "vllm") default: its newest release that does not say `default=False`, among the
    versions registered now (`ENGINES`)."""
    name = engine.strip().lower()
    found = next((ev for ev in ordered(ENGINES.values()) if ev.engine.lower() == name and ev.default
                  and ev.release is not None), None)  # fmt: skip
    if found is None:
        raise TpplanError(f"engine={engine}", "no release to default to", f"use one of {', '.join(ENGINES)}")
    return found


DEFAULT_ENGINES = tuple(default_release(name).key for name in ENGINE_NAMES)  # at import; `default_release` is live


def select(value: str) -> EngineVersion:
    """The engine version `value` names: `sglang@0.5.23`, `vllm@0.34.0`, or an engine alone (its default
    release). Bad input: TpplanError naming the choices."""
    key = value.strip().lower()
    if "@" not in key and key in (n.lower() for n in ENGINE_NAMES):
        return default_release(key)
    name = key.split("@")[0]
    if key not in ENGINES and name not in (n.lower() for n in ENGINE_NAMES):  # e.g. trtllm: kernel tables only
        raise TpplanError(f"engine={value}", f"tpplan has no launch flags or serving rules for {name}",
                          f"use sglang or vllm, or a version of them: {', '.join(ENGINES)}")  # fmt: skip
    if key not in ENGINES:
        raise TpplanError(f"engine={value}", "no engine data for that version", f"use one of {', '.join(ENGINES)}")
    return ENGINES[key]


def select_pair(values: list[str] | tuple[str, ...] | None) -> tuple[EngineVersion, EngineVersion]:
    """(SGLang, vLLM) versions from `--engine` values (each names one engine; the other keeps its default)."""
    chosen = {e.engine: e for e in (select(v) for v in (values or ()))}
    sgl = chosen.get("SGLang") or default_release("SGLang")
    vll = chosen.get("vLLM") or default_release("vLLM")
    return sgl, vll


def _version(key: str) -> EngineVersion | None:
    """The version `key` names ("sglang@0.5.23", or an engine alone), None where none is registered."""
    try:
        return select(key)
    except TpplanError:
        return None


def scheduler_rules(key: str) -> SchedulerRules:
    """The scheduler rules engine version `key` states (its release module); a TpplanError naming the versions."""
    ev = _version(key)
    rules = ev.scheduling if ev is not None else None
    if rules is None:
        have = [k for k, ev in ENGINES.items() if ev.scheduling is not None]
        raise TpplanError(f"engine={key}", "no scheduler rules read for that version", f"use one of {', '.join(have)}")
    return rules


def kv_sizing(key: str) -> KVSizing:
    """How engine version `key` sizes its KV cache (its release module); a TpplanError naming the versions."""
    ev = _version(key)
    memory = ev.memory if ev is not None else None
    if memory is None:
        have = [k for k, ev in ENGINES.items() if ev.memory is not None]
        raise TpplanError(f"engine={key}", "no KV-sizing facts read for that version", f"use one of {', '.join(have)}")
    return memory


def handoff_rule(key: str) -> tuple[HandoffRule, str | None]:
    """The P/D hand-off engine version `key` states and, where it states none, its engine's default release's
    with a note saying so."""
    ev = select(key)
    if ev.handoff is not None:
        return ev.handoff, None
    read = default_release(ev.engine)
    if read.handoff is None:
        raise TpplanError(f"engine={key}", "no P/D hand-off read for that engine", "use a version whose was read")
    return read.handoff, f"{ev.key}'s P/D hand-off was not read; {read.key}'s is used"


@dataclass(frozen=True)
class Path:
    """What an engine runs for a mode on one model: the wiring that applies, or why none does."""

    wiring: Wiring | None
    not_wired: NotWired | None

    @property
    def runs_plan(self) -> str | None:
        """The tpplan plan equal to what the engine runs (None: no tpplan plan is equal to it)."""
        if self.wiring is not None:
            return self.wiring.plan
        return self.not_wired.runs if self.not_wired is not None else None

    @property
    def wired(self) -> bool:
        return self.wiring is not None


def path_for(mode: Mode, spec: ModelSpec, variant: int = 0) -> Path:
    """The model class's path through `mode`: its `variant`-th wiring (0: the default one), or the
    NotWired entry that names it; a model class the data does not name is not wired (unknown)."""
    wirings = [w for w in mode.wiring if spec.model_type in w.model_types]
    if wirings:
        return Path(wirings[min(variant, len(wirings) - 1)], None)
    nw = next((n for n in mode.not_wired if spec.model_type in n.model_types), None)
    if nw is None:
        nw = NotWired(
            (spec.model_type,),
            "baseline" if mode.exists else "refused",
            f"the engine data names no wiring of this mode for model type {spec.model_type}",
            Source.unread(
                "-",
                "-",
                f"{mode.name} for {spec.model_type}",
                why="the mode's record names the model type in neither its wirings nor its not-wired entries: "
                "what the engine does with the flag for it was not read",
            ),
        )
    return Path(None, nw)


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    met: bool | None
    detail: str


def judge(mode: Mode, d: Launch) -> tuple[GateResult, ...]:
    """Every gate of `mode` decided for deployment `d` (met None: keep it as stated)."""
    return tuple(GateResult(g, *evaluate(g.check, d)) for g in mode.gates)


def engine_plans(spec: ModelSpec, engines: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The tpplan plans the engines' data names as what a mode runs on this model class (in order,
    once each): what a memo must price beside its own plans, so it compares what the engines run;
    `engines` None: the default releases."""
    versions = [select(key) for key in engines] if engines is not None else list(select_pair(None))
    modes = [m for ev in versions for m in ev.modes]
    names = [w.plan for m in modes for w in m.wiring if w.plan and spec.model_type in w.model_types]
    return tuple(dict.fromkeys(names))


def widths(spec: ModelSpec) -> dict[str, int]:
    """The width keys engine dataflows use, for one model."""
    out = {"hidden": spec.hidden, "2*hidden": 2 * spec.hidden}
    mla = mla_of(spec)
    if mla is not None:
        out["qkv_latent"] = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.rope_dim
    moe = next((layer.mlp for layer in spec.layers if isinstance(layer.mlp, MoESpec)), None)
    if moe is not None:
        out["moe_latent"] = moe.latent or spec.hidden
        out["moe_input"] = moe.latent or spec.hidden
    return out


def collectives(dataflow: tuple[Op | Comm, ...], spec: ModelSpec) -> list[tuple[str, int]]:
    """The dataflow's collectives as (collective, width) for one model."""
    w = widths(spec)
    return [(s.collective, w[s.width]) for s in dataflow if isinstance(s, Comm)]


def version_overlaps(ev: EngineVersion) -> tuple[MicroBatchOverlap, ...]:
    """`ev.overlaps`, each labelled with `ev`'s engine and version (a release that re-cites another's records
    keeps their label otherwise)."""
    label = f"{ev.engine} {ev.version}"
    return tuple(o if o.engine == label else replace(o, engine=label) for o in ev.overlaps)


def overlaps(key: str | None = None) -> dict[str, MicroBatchOverlap]:
    """The micro-batch overlaps engine version `key` states (its release module's `EngineVersion.overlaps`), by
    plan suffix; None: each engine's default release's (what a plan's `+tbo` / `+dbo` is priced as)."""
    versions = (select(key),) if key else select_pair(None)
    return {o.name: o for ev in versions for o in version_overlaps(ev)}


def overlap_named(name: str) -> MicroBatchOverlap:
    """The engine overlap a plan suffix names (`tbo`, `dbo`), as its engine's default release states it."""
    return overlaps()[name]


__all__ = [
    "DEFAULT_ENGINES",
    "ENGINES",
    "ENGINE_NAMES",
    "GateResult",
    "Launch",
    "Path",
    "collectives",
    "default_release",
    "engine_plans",
    "handoff_rule",
    "judge",
    "kv_sizing",
    "overlap_named",
    "overlaps",
    "path_for",
    "scheduler_rules",
    "select",
    "select_pair",
    "version_overlaps",
    "widths",
]
