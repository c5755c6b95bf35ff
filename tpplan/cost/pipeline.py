"""PP TTFT as the serving engine schedules it: the engine data's PP schedule as a pipeline model.

`pipeline_model("vllm@0.34.0")` picks an engine version's `PipelineSchedule` (tpplan.engines; the
default is the current SGLang release, the memo's default engine). `cost.predict.pipeline_ttft` runs a
workload's chunked-prefill batches through the stages as that engine does (`cost.workload.
simulate_pipeline`: a flow shop with the engine's micro-batches in flight), and `PipelineModel.assumption` (worded by
`PipelineSchedule.assumption` from the fields this module reads) says the same for the memo, so the
sentence and the prices cannot drift apart. Formulas: docs/cost-model.md
("Pipeline parallelism").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tpplan.engines import DEFAULT_ENGINES, ENGINE_NAMES, default_release, select
from tpplan.engines.schema import PipelineSchedule
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

DEFAULT_PP_ENGINE = DEFAULT_ENGINES[0]  # the memo's default engine: SGLang's current release


@dataclass(frozen=True)
class PipelineModel:
    """One engine version's PP prefill schedule, as the TTFT model reads it."""

    engine: str  # "sglang@0.5.23"
    label: str  # "SGLang 0.5.23"
    schedule: PipelineSchedule

    @property
    def chunks_overlap(self) -> bool:
        return self.schedule.chunks_overlap

    @property
    def boundary_gathers(self) -> bool:
        return self.schedule.boundary_gathers

    def in_flight(self, mesh: Mesh) -> int:
        """Micro-batches the engine keeps in the pipeline on `mesh`."""
        return self.schedule.in_flight_at(mesh)

    def assumption(self, mesh: Mesh | None = None) -> str:
        """The behaviour the PP prediction assumes on `mesh`, in one sentence, from the same fields it prices."""
        return self.schedule.assumption(self.label, mesh)


@lru_cache(maxsize=32)
def pipeline_model(engine: str | None = None) -> PipelineModel:
    """The PP schedule of `engine` (`sglang@0.5.23`, `vllm`, ...; None: the default engine).
    Bad input: TpplanError naming the engine versions tpplan has data for."""
    ev = select(engine or DEFAULT_PP_ENGINE)
    return PipelineModel(ev.key, f"{ev.engine} {ev.version}", ev.pipeline)


def loop_engine(kernels: str | None) -> str:
    """The engine version whose serving loop (PP schedule, chunk budget, speculative flags, router, launch
    lines) runs for the `--engine` value `kernels` (the kernel tables' engine): that version where tpplan read
    its serving rules (`engines/releases/`), the engine's default release for another of its versions (a
    kernel-database-only one), else (trtllm, or none) the default engine's. The one place that decides it."""
    if kernels is None:
        return DEFAULT_PP_ENGINE
    name = kernels.strip().lower().partition("@")[0]
    if name not in (n.lower() for n in ENGINE_NAMES):
        return DEFAULT_PP_ENGINE
    try:
        return select(kernels).key
    except TpplanError:
        return default_release(name).key


def loop_note(kernels: str | None) -> str:
    """One sentence where the loop's engine is not the one `--engine` named ("" where it is, or none was)."""
    loop = loop_engine(kernels)
    if kernels is None or kernels.strip().lower() == loop:
        return ""
    if "@" not in kernels and select(loop).engine.lower() == kernels.strip().lower():
        return ""  # an engine alone names its default release, the loop's
    return f"the serving loop runs {loop}'s rules: tpplan read no serving rules for {kernels} (its kernels price)"


def serving_pipeline(kernels: str | None) -> PipelineModel:
    """The PP schedule of the loop engine `--engine` `kernels` implies (`loop_engine`)."""
    return pipeline_model(loop_engine(kernels))


__all__ = ["DEFAULT_PP_ENGINE", "PipelineModel", "loop_engine", "loop_note", "pipeline_model", "serving_pipeline"]
