"""Engine knowledge as versioned data: what SGLang and vLLM really run for a flag, per model class.

`ENGINES` holds every engine version read (`tpplan.engines.sglang`, `tpplan.engines.vllm`, and one
module each in `tpplan.engines.releases`; the schema is `tpplan.engines.schema`). `select("sglang@0.5.23")`
picks one; `DEFAULT_ENGINES` are the current releases. `path_for(engine, mode, spec)` says which model
class wiring applies to a model, or that the model class does not wire the mode and what the engine
runs instead; `judge` decides a mode's gates for a deployment. Planner-level: no torch, no report.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines.gates import Launch, evaluate, mla_of
from tpplan.engines.releases import collect, discovered
from tpplan.engines.schema import Comm, EngineVersion, Gate, Mode, NotWired, Op, Source, Wiring
from tpplan.engines.sglang import SGLANG_0_5_23, SGLANG_OLDER
from tpplan.engines.vllm import VLLM_0_33_0, VLLM_0_34_0, VLLM_OLDER
from tpplan.errors import TpplanError
from tpplan.models.spec import ModelSpec, MoESpec

# The versions read in sglang.py and vllm.py, then one module per later version in `engines/releases/`.
ENGINES: dict[str, EngineVersion] = collect(
    (SGLANG_0_5_23, SGLANG_OLDER, VLLM_0_34_0, VLLM_0_33_0, VLLM_OLDER, *discovered())
)
DEFAULT_ENGINES = (SGLANG_0_5_23.key, VLLM_0_34_0.key)  # the current releases


def select(value: str) -> EngineVersion:
    """The engine version `value` names: `sglang@0.5.23`, `vllm@0.34.0`, or an engine alone (its current
    release). Bad input: TpplanError naming the choices."""
    key = value.strip().lower()
    if "@" not in key:
        key = next((d for d in DEFAULT_ENGINES if d.startswith(f"{key}@")), key)
    if key not in ENGINES:
        raise TpplanError(f"engine={value}", "no engine data for that version", f"use one of {', '.join(ENGINES)}")
    return ENGINES[key]


def select_pair(values: list[str] | tuple[str, ...] | None) -> tuple[EngineVersion, EngineVersion]:
    """(SGLang, vLLM) versions from `--engine` values (each names one engine; the other keeps its default)."""
    chosen = {e.engine: e for e in (select(v) for v in (values or ()))}
    sgl = chosen.get("SGLang", ENGINES[DEFAULT_ENGINES[0]])
    vll = chosen.get("vLLM", ENGINES[DEFAULT_ENGINES[1]])
    return sgl, vll


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
            Source.unread("-", "-", f"{mode.name} for {spec.model_type}"),
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


def engine_plans(spec: ModelSpec, engines: tuple[str, ...] = DEFAULT_ENGINES) -> tuple[str, ...]:
    """The tpplan plans the engines' data names as what a mode runs on this model class (in order,
    once each): what a memo must price beside its own plans, so it compares what the engines run."""
    modes = [m for key in engines for m in ENGINES[key].modes]
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


__all__ = [
    "DEFAULT_ENGINES",
    "ENGINES",
    "GateResult",
    "Launch",
    "Path",
    "collectives",
    "engine_plans",
    "judge",
    "path_for",
    "select",
    "select_pair",
    "widths",
]
