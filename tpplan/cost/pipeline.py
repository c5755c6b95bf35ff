"""PP TTFT as the serving engine schedules it: the engine data's PP schedule as a pipeline model.

`pipeline_model("vllm@0.33.0")` picks an engine version's `PipelineSchedule` (tpplan.engines; the
default is the current SGLang release, the memo's default engine). `pipeline_ttft` runs a workload's
chunked-prefill batches through the stages as that engine does (`cost.workload.simulate_pipeline`: a
flow shop with the engine's micro-batches in flight), and `PipelineModel.assumption` (worded by
`PipelineSchedule.assumption` from the fields this module reads) says the same for the memo, so the
sentence and the prices cannot drift apart. Formulas: docs/cost-model.md
("Pipeline parallelism").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from tpplan.cost.segments import segments_of
from tpplan.cost.workload import PrefillBatch, TTFTResult, Workload, simulate_pipeline, simulate_ttft
from tpplan.engines import DEFAULT_ENGINES, select
from tpplan.engines.schema import PipelineSchedule

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor

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

    def in_flight(self, pp: int) -> int:
        """Micro-batches the engine keeps in the pipeline at PP `pp`."""
        return self.schedule.in_flight_at(pp)

    def assumption(self, pp: int | None = None) -> str:
        """The behaviour the PP prediction assumes, in one sentence, from the same fields it prices."""
        return self.schedule.assumption(self.label, pp)


@lru_cache(maxsize=32)
def pipeline_model(engine: str | None = None) -> PipelineModel:
    """The PP schedule of `engine` (`sglang@0.5.23`, `vllm`, ...; None: the default engine).
    Bad input: TpplanError naming the engine versions tpplan has data for."""
    ev = select(engine or DEFAULT_PP_ENGINE)
    return PipelineModel(ev.key, f"{ev.engine} {ev.version}", ev.pipeline)


def pipeline_ttft(p: Predictor, workload: Workload) -> TTFTResult:
    """TTFT of `workload` on the predictor's stages as its engine (`p.pipeline`) schedules them
    (pp = 1: batches one after another). Each stage holds a batch for its compute, its TP collectives
    and its send into the next stage (the last one also for the reduction before the final norm)."""
    if p.pp == 1:
        return simulate_ttft(workload, lambda b: p.latency(segments_of(b)))
    m = p.pipeline

    def stages(batch: PrefillBatch) -> list[float]:
        stage_s, sends, _ = p.stage_times(segments_of(batch))
        return [s + x for s, x in zip(stage_s, sends, strict=True)]

    return simulate_pipeline(workload, stages, in_flight=m.in_flight(p.pp), chunks_overlap=m.chunks_overlap)


__all__ = ["DEFAULT_PP_ENGINE", "PipelineModel", "pipeline_model", "pipeline_ttft"]
