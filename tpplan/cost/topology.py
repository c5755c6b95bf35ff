"""Cluster topology: GPUs, intra-node links, inter-node network, constants fitted by calibration.

Bandwidths here are *achievable* figures (what NCCL's busbw reaches), not datasheet peaks: a plan's
predicted time is only as good as these numbers, and datasheet peaks overstate NCCL by 20-40%.
Units: GB/s = 1e9 bytes/s, Gb/s = 1e9 bits/s, TB/s = 1e12 bytes/s, latency in microseconds.
"""

from __future__ import annotations

import itertools
import math
from importlib import resources
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpplan.cost._files import read_mapping, validate
from tpplan.errors import unknown_name

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]
COLLECTIVE_KINDS: tuple[str, ...] = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "all_to_all",
    "send_recv",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GemmPoint(_Strict):
    """One measured GEMM: C[M,N] = A[M,K] @ B[K,N] reached `tflops` (dense, the GPU's own dtype)."""

    M: int = Field(ge=1)
    K: int = Field(ge=1)
    N: int = Field(ge=1)
    tflops: float = Field(gt=0)
    dtype: Literal["bf16", "fp8"] = "bf16"


class KernelProfile(_Strict):
    """Measured speed of one kernel class (norms, the recurrence, attention, ...) on this GPU.

    Written by `tpplan calibrate --kernels-from` from a bench run. `points` pairs the cost model's
    own estimate of an op (roofline seconds) with the time the kernel really took, sorted by the
    estimate; `apply` maps a new estimate through them. The estimate is the key because it already
    carries the op's shape, share and dtype, so one curve serves every plan and token count.
    """

    points: list[tuple[float, float]] = Field(min_length=1, description="(modelled s, measured s), ascending")
    samples: int = Field(default=0, ge=0, description="ops measured to build the curve")
    source: str = ""

    @model_validator(mode="after")
    def _ascending(self) -> Self:
        xs = [x for x, _ in self.points]
        if any(x <= 0 or y <= 0 for x, y in self.points) or xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("points must be positive (modelled s, measured s) pairs with rising modelled s")
        return self

    def apply(self, modelled_s: float) -> float:
        """Measured-equivalent seconds for an op the model estimates at `modelled_s`.

        Inside the measured range: log-log interpolation between the neighbouring points. Outside:
        the nearest point's measured/modelled ratio (kernels settle to a constant fraction of the
        roofline at large sizes; at small ones the launch floor is in the estimate already).
        """
        if modelled_s <= 0:
            return 0.0
        pts = self.points
        if modelled_s <= pts[0][0]:
            return modelled_s * pts[0][1] / pts[0][0]
        if modelled_s >= pts[-1][0]:
            return modelled_s * pts[-1][1] / pts[-1][0]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if x0 <= modelled_s <= x1:
                f = math.log(modelled_s / x0) / math.log(x1 / x0)
                return math.exp(math.log(y0) + f * math.log(y1 / y0))
        raise AssertionError("unreachable: points are ascending")


class GpuSpec(_Strict):
    """Per-GPU roofline numbers (dense, no sparsity) and optional measured GEMM and kernel tables."""

    name: str
    bf16_tflops: float = Field(gt=0, description="peak dense bf16 TFLOP/s")
    fp8_tflops: float = Field(gt=0, description="peak dense fp8 TFLOP/s")
    hbm_TBps: float = Field(gt=0, description="memory bandwidth, TB/s")
    memory_GiB: float = Field(gt=0)
    sm_count: int = Field(default=132, ge=1, description="SMs, for the analytic GEMM curve")
    gemm_table: list[GemmPoint] | None = Field(
        default=None, description="measured shapes; None = packaged table for its GPU or analytic"
    )
    kernel_profiles: dict[str, KernelProfile] = Field(
        default_factory=dict,
        description="measured kernel classes (key: op kind, or 'kind:op name'); none = roofline estimates",
    )
    gemm_scale: float = Field(
        default=1.0, gt=0, description="this machine's GEMM rate / the table's (`tpplan calibrate --quick`)"
    )
    kernel_models: dict[str, dict[str, float | str]] = Field(
        default_factory=dict,
        description="fitted constants of the physical kernel models (cost.kernel_models; `impl`: what they "
        "were fitted on); none = roofline",
    )


class AllReduceAlgorithm(_Strict):
    """An intra-node all-reduce algorithm the stack runs besides NCCL's ring (NVLS in-switch
    reduction, a one-shot/two-shot custom all-reduce, ...), priced with its own constants:
    time = launch + latency_us + 2(n-1)/n * size / busbw_GBps (nccl-tests' busbw convention), for
    sizes up to `max_bytes` and groups of `min_ranks` to `max_ranks`. Reduce-scatter and all-gather keep
    the ring. Declaring none keeps the ring alone (every datasheet preset today)."""

    name: str = Field(min_length=1, description="e.g. 'nvls', 'one-shot'; shown as the chosen algorithm")
    busbw_GBps: float = Field(gt=0, description="achievable all-reduce busbw of this algorithm")
    latency_us: float = Field(ge=0, description="fixed cost of one call beyond launch_us")
    max_bytes: float | None = Field(default=None, gt=0, description="largest size it runs at; None = any")
    max_ranks: int | None = Field(default=None, ge=2, description="largest group it runs on; None = any")
    min_ranks: int = Field(default=2, ge=2, description="smallest group it beats the ring on (NVLS: from 5-8 GPUs)")
    source: str = ""


class IntraLink(_Strict):
    """Link between GPUs of one node, as one GPU sees it (per direction)."""

    kind: Literal["nvlink", "pcie"]
    bandwidth_GBps: float = Field(gt=0, description="achievable per-GPU unidirectional busbw")
    latency_us: float = Field(ge=0, description="per ring step / hop")
    all_reduce: list[AllReduceAlgorithm] = Field(
        default_factory=list,
        description="intra-node all-reduce algorithms besides the ring; none = NCCL ring only",
    )


class InterLink(_Strict):
    """Node-to-node network. Aggregate per node = nics * Gb/s / 8 * efficiency."""

    nics_per_node: int = Field(ge=1)
    nic_Gbps: float = Field(gt=0)
    latency_us: float = Field(ge=0, description="per hop, host-to-host")
    efficiency: float = Field(default=0.9, gt=0, le=1, description="achievable / line rate")

    @property
    def nic_GBps(self) -> float:
        """Achievable bytes/s of one NIC, in GB/s."""
        return self.nic_Gbps / 8.0 * self.efficiency


class FittedCollective(_Strict):
    """Constants fitted by `tpplan calibrate` for one collective kind on one node.

    Model: time = alpha_us + busfactor(kind, n) * size / busbw_GBps, where alpha_us was measured at
    `group_size` ranks (rescaled by ring steps for other group sizes). `curve` keeps the measured
    (bytes, seconds) points: within their range and at the same group size, the prediction
    interpolates them (NCCL switches protocol and channel count with size, which one alpha and one
    bandwidth cannot follow); outside it, the alpha-beta line extrapolates.
    """

    alpha_us: float = Field(ge=0)
    busbw_GBps: float = Field(gt=0)
    group_size: int = Field(ge=2)
    backend: str = "nccl"
    points: int = Field(default=0, ge=0)
    max_rel_err: float = Field(default=0.0, ge=0)
    curve: list[tuple[float, float]] = Field(default_factory=list)


class Topology(_Strict):
    """Nodes x GPUs with their links; `fitted` (from calibration) overrides the link model."""

    name: str
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    gpu: GpuSpec
    intra: IntraLink
    inter: InterLink | None = None
    launch_us: float = Field(default=20.0, ge=0, description="fixed per-call cost of one collective (launch, sync)")
    fitted: dict[CollectiveKind, FittedCollective] = Field(default_factory=dict)
    notes: str = ""

    @model_validator(mode="after")
    def _network_when_multinode(self) -> Self:
        if self.nodes > 1 and self.inter is None:
            raise ValueError("nodes > 1 needs an [inter] network section")
        return self

    @property
    def world_size(self) -> int:
        """Total GPUs."""
        return self.nodes * self.gpus_per_node

    def with_nodes(self, nodes: int) -> Topology:
        """Same hardware, another node count (validated)."""
        return validate(Topology, {**self.model_dump(), "nodes": nodes}, f"topology {self.name}")


_PRESETS = "presets"


def list_topologies() -> list[str]:
    """Names of the packaged topology presets."""
    root = resources.files("tpplan.cost").joinpath(_PRESETS)
    return sorted(
        p.name[: -len(".toml")]
        for p in root.iterdir()
        if p.name.endswith(".toml") and not p.name.startswith("workload-")
    )


def load_topology(name_or_path: str, nodes: int | None = None) -> Topology:
    """Load a preset by name or a .toml/.json file; `nodes` overrides the node count.

    Every validation problem becomes a TpplanError naming the file and the field.
    """
    path = Path(name_or_path)
    if path.suffix.lower() in (".toml", ".json") or path.exists():
        data = read_mapping(path)
        where = str(path)
    else:
        if name_or_path not in list_topologies():
            known = list_topologies()
            raise unknown_name("a .toml/.json topology", name_or_path, known, "--topology", "tpplan topologies")
        res = resources.files("tpplan.cost").joinpath(_PRESETS, f"{name_or_path}.toml")
        import tomllib

        data = tomllib.loads(res.read_text(encoding="utf-8"))
        where = f"preset {name_or_path}"
    if nodes is not None:
        data = {**data, "nodes": nodes}
    return validate(Topology, data, where)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        import json

        return json.dumps(v)  # a JSON string literal is a valid TOML basic string
    if isinstance(v, list) and all(not isinstance(x, dict) for x in v):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as an inline TOML value")


def _toml_key(k: str) -> str:
    """A bare TOML key when it is one, else a quoted one (kernel profile keys hold ':')."""
    import json
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_table(data: dict[str, object], prefix: str, out: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if v is not None and not isinstance(v, dict) and not _is_table_list(v)}
    if prefix and (scalars or not data):
        out.append(f"\n[{prefix}]")
    for k, v in scalars.items():
        out.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in data.items():
        key = f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)
        if isinstance(v, dict):
            _toml_table(v, key, out)
        elif _is_table_list(v):
            for item in v:  # type: ignore[union-attr]
                out.append(f"\n[[{key}]]")
                out.extend(f"{ik} = {_toml_value(iv)}" for ik, iv in item.items())


def _is_table_list(v: object) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def topology_to_toml(topo: Topology, header: str = "") -> str:
    """Serialise a topology to TOML that `load_topology` reads back unchanged."""
    out = [f"# {line}" for line in header.splitlines()]
    data = topo.model_dump(mode="json", exclude_none=True)
    if not data["intra"].get("all_reduce"):
        data["intra"].pop("all_reduce", None)  # no declaration: files read as before
    _toml_table(data, "", out)
    return "\n".join(out).lstrip("\n") + "\n"
