"""The GPU benchmark's results file: schema, parser and error statistics.

`tpplan bench` writes one JSON object per run; `tpplan report --bench FILE` reads it to put
measured beside predicted, and the cost model's kernel fit (`cost/kernel_fit.py`) reads it to fit
kernel profiles. It lives outside bench/, report/ and cost/, torch-free, so all three can import
it without importing each other; docs/bench-json.md describes every field. A file that does not match raises
TpplanError naming the file and the field, so the CLI exits 2 instead of drawing wrong plots.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpplan.errors import TpplanError, validated
from tpplan.inputs import load_json

BENCH_SCHEMA_VERSION = 2  # written; version 1 (no `inputs`) is still read
READ_VERSIONS = (1, 2)

CollectiveKindName = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]
DtypeName = Literal["bf16", "fp16", "fp32", "fp8"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timed(_Strict):
    """Something measured with CUDA events (median over `iters` after `warmup`) and its prediction."""

    measured_s: float = Field(gt=0, description="median wall time of the slowest rank, seconds")
    predicted_s: float | None = Field(default=None, ge=0, description="tpplan's prediction for the same thing")
    iters: int = Field(default=1, ge=1)

    @property
    def rel_error(self) -> float | None:
        """(predicted - measured) / measured; None without a prediction."""
        if self.predicted_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s


class CollectiveResult(Timed):
    """One collective call as the plan issues it (kind, tensor shape, dtype, bytes)."""

    kind: CollectiveKindName
    label: str = Field(default="", description="the plan's name for it, e.g. 'AR delta[7168]'")
    layer_kind: str | None = None
    shape: list[int] = Field(min_length=1, description="the tensor passed to torch.distributed")
    dtype: DtypeName = "bf16"
    bytes: int = Field(ge=0, description="nccl-tests size: AR buffer, AG output, RS input, A2A send buffer")
    group_size: int = Field(ge=1)
    algorithm: str | None = Field(default=None, description="the algorithm the prediction chose")
    direct_s: float | None = Field(
        default=None, gt=0, description="same collective issued directly with torch.distributed (overhead check)"
    )
    replay_s: float | None = Field(
        default=None,
        gt=0,
        description="the same call through tpplan's runtime Comm, timed like direct_s (runtime overhead)",
    )


class OpResult(Timed):
    """One op of one layer (a GEMM, attention, the KDA recurrence, a norm, the MoE experts)."""

    layer_kind: str
    op: str
    category: str | None = Field(default=None, description="gemm | attention | recurrence | norm | moe | other")
    tokens: int = Field(ge=1)
    flops: float | None = Field(default=None, ge=0, description="per rank")
    kernel: str | None = Field(default=None, description="kernel class (models.opkinds.kernel_key); None for GEMMs")
    modelled_s: float | None = Field(
        default=None, gt=0, description="the model's roofline estimate before any kernel profile (predicted_s)"
    )
    impl: str | None = Field(
        default=None, description="the implementation the op ran (e.g. 'fla.chunk_kda', 'torch._grouped_mm')"
    )
    source: str | None = Field(
        default=None,
        description="what priced the prediction (`OpTime.source`: kernel-model, gemm-table, roofline, aic:..., ...)",
    )
    band: str | None = Field(
        default=None,
        description="its own error-table class where not its category's (`OpTime.band`: attention_window, "
        "attention_chunked, dsa_indexer, attention_sparse); None: the category's band, and files written before "
        "2026-12-06",
    )

    @property
    def estimate_s(self) -> float | None:
        """The model's own estimate: `modelled_s`, or `predicted_s` in files written before kernel
        profiles existed (their predictions were the estimates)."""
        return self.modelled_s if self.modelled_s is not None else self.predicted_s

    @property
    def profiled(self) -> bool:
        """Its prediction came through a measured kernel profile (differs from the estimate)."""
        return bool(self.kernel and self.modelled_s and self.predicted_s and self.modelled_s != self.predicted_s)


class LayerResult(Timed):
    """One whole layer forward (compute and collectives) at `tokens` tokens."""

    layer_kind: str
    tokens: int = Field(ge=1)
    comm_measured_s: float | None = Field(default=None, ge=0)
    compute_measured_s: float | None = Field(default=None, ge=0)


class BatchResult(Timed):
    """One prefill batch of the workload through the model slice."""

    index: int = Field(ge=0)
    tokens: int = Field(ge=1)
    requests: list[int] = Field(default_factory=list, description="request ids with a chunk in this batch")


class ModelSlice(_Strict):
    """What part of the model ran: real widths, fewer layers and experts."""

    description: str = Field(min_length=1)
    layer_kinds: dict[str, int] = Field(description="layer kind -> layers of it in the slice")
    experts: int | None = Field(default=None, ge=1, description="routed experts kept (of the model's)")
    hidden: int | None = Field(default=None, ge=1)
    sized: str | None = Field(
        default=None, description="what the card's memory cut (experts, requests), in words; files since 2026-12-06"
    )


class BenchMeta(_Strict):
    """Where, when and how the run happened, so a reader can reproduce it."""

    machine: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    gpus: int = Field(ge=1)
    date: datetime
    command: str = Field(min_length=1)
    torch_version: str
    nccl_version: str | None = None
    cuda_version: str | None = None
    tpplan_version: str | None = None
    gpu_uuids: list[str] | None = Field(
        default=None, description="the GPUs' UUIDs: tells runs on the same physical GPUs from others"
    )


class TTFTExtrapolation(_Strict):
    """The whole-model TTFT on the target topology, from the measured slice."""

    topology: str = Field(description="for people, e.g. 'h200x8-ib400 x4 nodes (TP32)'")
    workload: str
    mean_s: float = Field(ge=0)
    p50_s: float = Field(ge=0)
    max_s: float = Field(ge=0)
    predicted_mean_s: float | None = Field(default=None, ge=0)
    target: str | None = Field(default=None, description="the target topology's name (files since 2026-12-01)")
    nodes: int | None = Field(default=None, ge=1, description="its nodes")
    tp: int | None = Field(default=None, ge=1, description="the TP size extrapolated to")


class RuntimeOverhead(_Strict):
    """How long the GPU waited on the host inside the plan's own run (`bench --overhead`,
    `tpplan.bench.overhead`): one pass of the workload with no probe events, timed by events
    (`pass_s`), and one under the profiler, whose kernel intervals give the busy time."""

    pass_s: float = Field(gt=0, description="the whole workload once, no probe events (slowest rank)")
    busy_s: float = Field(gt=0, description="union of the GPU's kernel and copy intervals in a profiled pass")
    kernels: int = Field(ge=0, description="kernels and copies the profiled pass ran (rank of pass_s)")
    by_kernel: list[tuple[str, int, float]] = Field(
        default_factory=list, description="the profiled pass's GPU time by kernel name: (name, calls, seconds), top 30"
    )
    clocks: dict[str, float] | None = Field(
        default=None,
        description="NVML over the timed pass: sm_mhz_mean, sm_mhz_min, power_w_mean, temp_c_max, samples; "
        "the GPU's sm_mhz_max and power_limit_w",
    )

    @property
    def overhead(self) -> float:
        """pass_s / busy_s - 1: the share of the pass the GPU sat idle."""
        return self.pass_s / self.busy_s - 1.0


class BenchInputs(_Strict):
    """What the run was given, by content, so that `bench --from R.json --repredict` needs no other
    file and works from any folder (files since schema version 2)."""

    config: dict[str, Any] = Field(description="the model's config.json (or preset) as the run read it")
    workload: dict[str, Any] = Field(description="the workload file (or preset) as the run read it, "
                                     "before --tokens/--chunk/--requests")  # fmt: skip


class BatchTiming(_Strict):
    """One prefill batch's timed runs (every pass on every rank) as `bench.host_ahead` issued them."""

    index: int = Field(ge=0)
    runs: int = Field(ge=1, description="timed runs of the batch: passes x ranks")
    host_s: float = Field(ge=0, description="the longest host time to issue the batch")
    sleep_s: float | None = Field(default=None, ge=0, description="host-ahead: the shortest sleep queued before it")
    caught_up: int = Field(
        default=0,
        ge=0,
        description="host-ahead: runs whose sleep had ended when the host finished issuing the batch (the GPU may "
        "have waited for the host inside them)",
    )
    gap_s: float = Field(ge=0, description="the largest GPU time between consecutive op spans, summed over the batch")


class OpTiming(_Strict):
    """How the op, layer and batch events were timed (issue 34): with the host ahead of the GPU, as issued, or
    CPU wall clock."""

    mode: Literal["host-ahead", "as-issued", "cpu"]
    sleep_margin: float | None = Field(default=None, gt=0, description="sleep / the untimed pass's host time")
    batches: list[BatchTiming] = Field(default_factory=list)


class BenchResults(_Strict):
    """One `tpplan bench` run: one model slice, one plan, one TP size."""

    schema_version: Literal[1, 2]
    meta: BenchMeta
    model: str
    plan: str
    tp: int = Field(ge=1)
    workload: str | None = None
    topology: str | None = Field(default=None, description="topology the predictions used (calibrated file)")
    model_slice: ModelSlice
    collectives: list[CollectiveResult] = Field(default_factory=list)
    ops: list[OpResult] = Field(default_factory=list)
    layers: list[LayerResult] = Field(default_factory=list)
    batches: list[BatchResult] = Field(default_factory=list)
    ttft: list[TTFTExtrapolation] = Field(default_factory=list)
    runtime_overhead: RuntimeOverhead | None = Field(default=None, description="bench --overhead")
    inputs: BenchInputs | None = Field(default=None, description="the model config and workload by content")
    timing: OpTiming | None = Field(default=None, description="how the events were timed; absent: as issued")

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if not (self.collectives or self.ops or self.layers or self.batches):
            raise ValueError("no measurements: collectives, ops, layers and batches are all empty")
        return self


def parse_bench_results(data: object, where: str = "bench results") -> BenchResults:
    """Validate an already-parsed JSON value."""
    if not isinstance(data, dict):
        raise TpplanError(where, "the top level is not a JSON object", "write one object (docs/bench-json.md)")
    version = data.get("schema_version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise TpplanError(
            f"{where}: schema_version",
            f"got {version!r}, this tpplan reads versions {' and '.join(map(str, READ_VERSIONS))}",
            "regenerate the file with this tpplan's `tpplan bench`",
        )
    return validated(BenchResults, data, where, "fix '{field}' (schema: docs/bench-json.md)")


def load_bench_results(path: str | Path, option: str = "--bench") -> BenchResults:
    """Read and validate a results file; every problem is a TpplanError naming the option and file."""
    data = load_json(path, f"{option} {path}", "pass the JSON file that `tpplan bench` wrote (or regenerate it)")
    return parse_bench_results(data, str(path))


def error_summary(items: list[Timed]) -> dict[str, float | int | None]:
    """Median and worst |relative error| over the items that carry a prediction."""
    errs = [abs(e) for e in (i.rel_error for i in items) if e is not None]
    if not errs:
        return {"n": 0, "median_abs_err": None, "max_abs_err": None}
    return {"n": len(errs), "median_abs_err": statistics.median(errs), "max_abs_err": max(errs)}


__all__ = [
    "BENCH_SCHEMA_VERSION",
    "READ_VERSIONS",
    "BatchResult",
    "BatchTiming",
    "BenchInputs",
    "BenchMeta",
    "BenchResults",
    "CollectiveResult",
    "LayerResult",
    "ModelSlice",
    "OpResult",
    "OpTiming",
    "TTFTExtrapolation",
    "error_summary",
    "load_bench_results",
    "parse_bench_results",
]
