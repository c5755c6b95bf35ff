"""A cluster: nodes of GPUs, the fabric inside and between nodes, and what its collectives cost.

Bandwidths here are *achievable* figures (what NCCL's busbw reaches), not datasheet peaks: a plan's
predicted time is only as good as these numbers, and datasheet peaks overstate NCCL by 20-40%.
Units: GB/s = 1e9 bytes/s, Gb/s = 1e9 bits/s, latency in microseconds.

A cluster prices collectives three ways, first match wins (`collective_pricer.price_collective`):
measured `curves` (points (bytes, seconds) per kind x algorithm x ranks, e.g. nccl-tests tables),
then `fitted` alpha-beta constants from `tpplan calibrate`, then the link model (ring / tree /
hierarchical, plus the declared intra-node all-reduce algorithms such as NVLS).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from tpplan.cost.gpu import MIN_RATE, Strict
from tpplan.inputs import NAME_CHARS
from tpplan.lower.sizes import COLLECTIVE_KINDS

CollectiveKind = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]

MAX_GBPS = 1e6  # 1 PB/s per GPU: above any fabric
MAX_US = 1e6  # one second of latency per call: above any network
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024


class AllReduceAlgorithm(Strict):
    """An intra-node all-reduce algorithm the stack runs besides NCCL's ring (NVLS in-switch
    reduction, a one-shot/two-shot custom all-reduce, ...), priced with its own constants:
    time = launch + latency_us + 2(n-1)/n * size / busbw_GBps (nccl-tests' busbw convention), for
    sizes up to `max_bytes` and groups of `min_ranks` to `max_ranks`. Reduce-scatter and all-gather keep
    the ring. Declaring none keeps the ring alone (every datasheet preset today)."""

    name: str = Field(min_length=1, description="e.g. 'nvls', 'one-shot'; shown as the chosen algorithm")
    busbw_GBps: float = Field(ge=MIN_RATE, le=MAX_GBPS, description="achievable all-reduce busbw of this algorithm")
    latency_us: float = Field(ge=0, le=MAX_US, description="fixed cost of one call beyond launch_us")
    max_bytes: float | None = Field(default=None, gt=0, le=1e15, description="largest size it runs at; None = any")
    max_ranks: int | None = Field(default=None, ge=2, le=MAX_GPUS_PER_NODE, description="largest group; None = any")
    min_ranks: int = Field(default=2, ge=2, le=MAX_GPUS_PER_NODE, description="smallest group it beats the ring on")
    source: str = ""


class IntraLink(Strict):
    """Link between GPUs of one node, as one GPU sees it (per direction)."""

    kind: Literal["nvlink", "pcie"]
    bandwidth_GBps: float = Field(ge=MIN_RATE, le=MAX_GBPS, description="achievable per-GPU unidirectional busbw")
    latency_us: float = Field(ge=0, le=MAX_US, description="per ring step / hop")
    all_reduce: list[AllReduceAlgorithm] = Field(
        default_factory=list,
        description="intra-node all-reduce algorithms besides the ring; none = NCCL ring only",
    )


class InterLink(Strict):
    """Node-to-node network. Aggregate per node = nics * Gb/s / 8 * efficiency."""

    nics_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    nic_Gbps: float = Field(ge=MIN_RATE, le=MAX_GBPS * 8)
    latency_us: float = Field(ge=0, le=MAX_US, description="per hop, host-to-host")
    efficiency: float = Field(default=0.9, gt=0, le=1, description="achievable / line rate")

    @property
    def nic_GBps(self) -> float:
        """Achievable bytes/s of one NIC, in GB/s."""
        return self.nic_Gbps / 8.0 * self.efficiency


class FittedCollective(Strict):
    """Constants fitted by `tpplan calibrate` for one collective kind on one node.

    Model: time = alpha_us + busfactor(kind, n) * size / busbw_GBps, where alpha_us was measured at
    `group_size` ranks (rescaled by ring steps for other group sizes). `curve` keeps the measured
    (bytes, seconds) points: within their range and at the same group size, the prediction
    interpolates them (NCCL switches protocol and channel count with size, which one alpha and one
    bandwidth cannot follow); outside it, the alpha-beta line extrapolates.
    """

    alpha_us: float = Field(ge=0, le=MAX_US)
    busbw_GBps: float = Field(ge=MIN_RATE, le=MAX_GBPS)
    group_size: int = Field(ge=2, le=MAX_NODES * MAX_GPUS_PER_NODE)
    backend: str = "nccl"
    points: int = Field(default=0, ge=0)
    max_rel_err: float = Field(default=0.0, ge=0)
    curve: list[tuple[float, float]] = Field(default_factory=list)


CURVE_BYTES = (1, 2**50)  # a collective's message: 1 B to 1 PiB
CURVE_S = (1e-9, 3600.0)  # its time: 1 ns to an hour


class CollectiveCurve(Strict):
    """Measured times of one collective kind run by one algorithm on `ranks` GPUs (`ranks_per_node`
    of them per node; default: as many as fit on a node): (nccl-tests size in bytes, seconds),
    ascending in size. Inside the points: log-log interpolation. Below the smallest: its time (the
    latency floor). Above the largest: that point's bus bandwidth. `source` cites the measurement."""

    kind: CollectiveKind
    algorithm: str = Field(min_length=1, description="ring, tree, nvls, one-shot, two-shot, nccl-default, ...")
    ranks: int = Field(ge=2, le=MAX_NODES * MAX_GPUS_PER_NODE)
    ranks_per_node: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_NODE)
    points: list[tuple[float, float]] = Field(min_length=2, description="(bytes, seconds), ascending")
    source: str = ""

    @model_validator(mode="after")
    def _ascending(self) -> Self:
        xs = [x for x, _ in self.points]
        if any(x <= 0 or y <= 0 for x, y in self.points) or xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("points must be positive (bytes, seconds) pairs with rising bytes")
        # physical bounds: the latency fit squares sizes and divides by times, so 1e308 overflowed (issue 35)
        bad = next(((x, y) for x, y in self.points if not (1 <= x <= CURVE_BYTES[1] and CURVE_S[0] <= y <= CURVE_S[1])),
                   None)  # fmt: skip
        if bad is not None:
            raise ValueError(f"point {bad} is outside 1 B to {CURVE_BYTES[1]:.0e} B and {CURVE_S[0]:g} s to "
                             f"{CURVE_S[1]:g} s, no collective's size or time")  # fmt: skip
        return self


class Fabric(Strict):
    """What a cluster and a topology (`cost.topology`) both are: nodes x GPUs, the links inside and
    between nodes, the launch cost, fitted constants and measured curves, declared and checked once."""

    name: str = Field(min_length=1, max_length=3 * NAME_CHARS)  # a topology@cluster name composes two
    nodes: int = Field(ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    intra: IntraLink
    inter: InterLink | None = None
    launch_us: float = Field(default=20.0, ge=0, le=MAX_US, description="fixed per-call cost of one collective")
    fitted: dict[CollectiveKind, FittedCollective] = Field(default_factory=dict)
    curves: list[CollectiveCurve] = Field(default_factory=list)
    imex_channel: bool | None = Field(
        default=None,
        strict=True,  # true or false, not "yes" or 1: a TOML/JSON boolean
        description="whether a server's process on these nodes can open an IMEX channel "
        "(/dev/nvidia-caps-imex-channels/channel*), which NVLink fabric memory handles need (GB200/GB300 NVL72 "
        "class racks); vLLM 0.34.0's P/D servers keep the extensible KV cache only with one. None: not stated, "
        "taken as none (docs/cost-model.md, 'KV capacity')",
    )

    @model_validator(mode="after")
    def _network_when_multinode(self) -> Self:
        if self.nodes > 1 and self.inter is None:
            raise ValueError("nodes > 1 needs an [inter] network section")
        return self

    @property
    def world_size(self) -> int:
        """Total GPUs."""
        return self.nodes * self.gpus_per_node


class Cluster(Fabric):
    """Nodes x GPUs with their links, launch cost, fitted constants and measured curves. It names the
    GPU model it holds by default (`gpu`: a GPU preset or file; `--gpu` overrides it)."""

    gpu: str | None = Field(default=None, description="the GPU model preset or file this cluster holds by default")
    notes: str = ""
    provenance: str = Field(default="", description="where the link figures and curves come from")


# The fabric's fields but its name: what a topology takes from its cluster and gives back
CLUSTER_FIELDS: tuple[str, ...] = tuple(k for k in Fabric.model_fields if k != "name")

__all__ = [
    "CLUSTER_FIELDS",
    "COLLECTIVE_KINDS",
    "AllReduceAlgorithm",
    "Cluster",
    "CollectiveCurve",
    "CollectiveKind",
    "Fabric",
    "FittedCollective",
    "InterLink",
    "IntraLink",
]
