"""How the memo's answer depends on where kernel prices come from (issue 33, item 2).

The same question priced from the GPU model's own kernel prices (the default: tpplan's measured
kernel models, GEMM table or datasheet roofline) and from each engine's measured kernel tables
(AIConfigurator's SGLang, vLLM and TRT-LLM databases for the GPU's system, as `--engine` adds them)
can give a different answer: on DeepSeek-V3 at TP8 the default made `sp-moe` 44.8% faster than
baseline and SGLang's tables 34.7% slower (issue 33's figures). The memo prices today's deployment and the bottom line's
target under every source, states which source its times come from and why, and says in the answer
when the sources disagree by more than their bands.

Disagreement: the changes g_a, g_b of two sources differ by more than the sum of their bands (each
the composed band of today's deployment under that source), |g_a - g_b| > band_a + band_b: no error
inside either band reconciles them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.errors import TpplanError
from tpplan.report.results import Variant
from tpplan.report.rows import KernelSensitivity, SourceAnswer

DEFAULT = "default"
ENGINE_KINDS = ("aic", "aic-fitted")  # the kernel sources `--engine` adds to a GPU model


def _source_label(name: str, topology: Topology) -> str:
    if name == DEFAULT:
        gpu = topology.gpu
        return f"the GPU model's own kernel prices (`{topology.gpu_preset or gpu.name}`)"
    return f"AIConfigurator's {name} tables (`--engine {name}`)"


def _without_engine(topology: Topology) -> Topology:
    """The topology with its GPU model's own kernel prices only (the sources `--engine` added removed)."""
    gpu = topology.gpu
    own = [r for r in gpu.sources if r.kind not in ENGINE_KINDS]
    if len(own) == len(gpu.sources):
        return topology
    return topology.model_copy(update={"gpu": gpu.model_copy(update={"sources": own})})


def _engines(topology: Topology) -> tuple[list[str], list[str]]:
    """(engines whose AIC tables cover the GPU's system, notes on why others are not compared)."""
    from tpplan.cost.sources.aic import AIC_ENGINES, aic_available, aic_databases, resolve_system

    if not topology.gpu.system:
        return [], [f"engine tables: GPU model `{topology.gpu.name}` names no kernel-database system"]
    if not aic_available():
        return [], ['engine tables: AIConfigurator is not installed (pip install "tpplan[aic]")']
    held = aic_databases().get(resolve_system(topology.gpu.system), {})
    missing = [e for e in AIC_ENGINES if e not in held]
    notes = [f"{e}: AIConfigurator has no tables for {topology.gpu.system}" for e in missing]
    return [e for e in AIC_ENGINES if e in held], notes


def chosen_source(topology: Topology) -> str:
    """The source the memo's own times come from: the engine `--engine` named, else the default."""
    return next((r.engine or "sglang" for r in topology.gpu.sources if r.kind == "aic"), DEFAULT)


PredictAt = Callable[[Variant, Topology], Any]  # a variant's prediction at the first workload on a topology


def _source_topologies(topology: Topology) -> tuple[dict[str, Topology], list[str]]:
    plain = _without_engine(topology)
    engines, skipped = _engines(topology)
    tops = {DEFAULT: plain} | {
        e: plain.model_copy(update={"gpu": plain.gpu.with_engine(e), "name": f"{plain.name}/{e}"}) for e in engines
    }
    return tops, skipped


def rerun(source: str) -> str:
    """How to price a memo from `source`: the GPU model's own prices are the default, which no flag names."""
    return "rerun without `--engine`" if source == DEFAULT else f"rerun with `--engine {source}`"


def kernel_sensitivity(
    topology: Topology,
    current: Variant,
    target: Variant,
    candidates: list[Variant],
    workload: Workload,
    predict: PredictAt,
) -> KernelSensitivity | None:
    """`target` and each source's best of `candidates` (engine-run plans at today's shape) against
    today's deployment, priced from every kernel-price source (see the module docstring)."""
    chosen = chosen_source(topology)
    tops, skipped = _source_topologies(topology)
    priced: list[SourceAnswer] = []
    shown = [target.key]
    for name, topo in tops.items():
        try:
            times = {}
            for v in {v.key: v for v in [current, target, *candidates]}.values():
                p = v.predictions.get(workload.name) if name == chosen else predict(v, topo)
                if p is not None and p.ttft is not None:
                    times[v.key] = (p.ttft.mean_s, getattr(p.provenance, "band", 0.0))
        except (TpplanError, NotImplementedError, ValueError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        if current.key not in times:
            continue
        now, band = times.pop(current.key)
        label = _source_label(name, topology)
        priced += [SourceAnswer(name, label, k, now, t, band) for k, (t, _) in times.items()]
        own = [k for k in times if k != target.key]
        if own:
            shown.append(min(own, key=lambda k: times[k][0]))
    targets = tuple(dict.fromkeys(shown))
    answers = tuple(s for t in targets for s in priced if s.target == t)
    mine = next((s for s in answers if s.name == chosen and s.target == target.key), None)
    if mine is None:
        return None
    narrowest = min((s for s in answers if s.target == target.key), key=lambda s: s.band)
    why = "the command named it (`--engine`)" if chosen != DEFAULT else "the command named no `--engine`"
    reason = (
        f"This memo's times come from {mine.label}: {why}, and its composed band for today's deployment is "
        f"±{100 * mine.band:.1f}%"
        + (
            "; it is the narrowest of the sources compared."
            if narrowest.name == chosen
            else f"; the narrowest is that of {narrowest.label}, ±{100 * narrowest.band:.1f}% ({rerun(narrowest.name)} "
            "to price from it)."
        )
    )
    return KernelSensitivity(current.key, targets, workload.name, chosen, answers, reason, tuple(skipped))


def sensitivity_of(a: Any, price: Callable[[Variant, Workload, Topology], Any]) -> KernelSensitivity | None:
    """The memo's `KernelSensitivity` (`a`: its `Analysis`): today's deployment against the bottom
    line's target (the best next step when it keeps), at the first workload, each priced by `price` on each
    source's topology as the memo priced them (the memo's own pricing: expert dtype, CP with its layers and
    KV, replicas, the PP schedule)."""
    wl = a.workloads[0] if a.workloads else None
    if wl is None or a.bottom is None:
        return None
    key = a.bottom.target if a.bottom.action == "switch" else (a.next_steps[0].key if a.next_steps else None)
    target = a.variant(key) if key else None
    if target is None or target is a.current:
        return None

    def predict(v: Variant, topo: Topology) -> Any:
        return price(v, wl, topo)

    shape = a.current.shape
    runs = [v for v in a.variants if v.shape == shape and v.legal and v is not a.current
            and any(r.runs for r in v.engines)]  # fmt: skip
    return kernel_sensitivity(a.topology, a.current, target, runs, wl, predict)


__all__ = [
    "DEFAULT",
    "KernelSensitivity",
    "SourceAnswer",
    "chosen_source",
    "kernel_sensitivity",
    "rerun",
    "sensitivity_of",
]
