"""A deployment: how many GPUs of a cluster a model runs on and how they split it (R x TP x CP x PP x EP).

One object instead of loose ints, validated once against the cluster it runs on, so every pricer
downstream can trust that the groups fit: a TP group larger than a node fills whole nodes, the
GPUs it needs exist, an EP group divides the TP group it splits the experts over, and `replicas`
identical copies of the TP x CP x PP deployment each sit on GPUs of their own, placed alike on the
nodes (so one replica's prices are every replica's; the workload's requests are split between them
by `tpplan.cost.workload.replica_workloads`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from tpplan.errors import TpplanError


class Fabric(Protocol):
    """What a deployment is checked against: a `Cluster`, a `Topology`, or one replica's share of one."""

    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...

    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True)
class Deployment:
    """`replicas` x (TP `tp` x CP `cp` x PP `pp`), routed experts split EP `ep` inside each TP group.
    CP: `cp` TP groups per stage, each on its share of the tokens (`layout.context_parallel`); ranks
    are ordered replica, stage, CP, TP, so a TP group keeps consecutive GPUs and a replica its own
    block of `replica_gpus` (a TP16 replica on nodes of 8 holds two whole nodes)."""

    tp: int
    pp: int = 1
    ep: int | None = None
    replicas: int = 1  # identical copies, each serving its share of the requests
    cp: int = 1
    cp_recurrence: str = "scan"  # how linear attention hands its state on under CP: "scan" or "serial"
    cp_layers: str = "all"  # "all": every layer token-sharded; "mla": only MLA layers, CP inside the TP group
    # KV per CP rank: "engines" (default): the whole sequence's, as SGLang and vLLM keep it; "sharded": tpplan's
    # own 1/cp (`tpplan.engines.context_parallel.kv_cp_share`)
    cp_kv: str = "engines"

    @property
    def replica_gpus(self) -> int:
        """GPUs one replica occupies (TP x CP x PP; `cp_layers="mla"`: the CP group is inside the TP group)."""
        return self.tp * (self.cp if self.cp_layers == "all" else 1) * self.pp

    @property
    def gpus(self) -> int:
        """GPUs the deployment occupies, every replica's."""
        return self.replica_gpus * self.replicas

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes it uses on a cluster of `gpus_per_node` GPUs per node."""
        return math.ceil(self.gpus / gpus_per_node)

    def ranks_per_node(self, gpus_per_node: int) -> int:
        """TP ranks that share one node."""
        return min(self.tp, gpus_per_node)

    def check(self, cluster: Fabric) -> Deployment:
        """Itself, after checking it fits `cluster` (a `Cluster` or `Topology`); a TpplanError else."""
        tp, pp, r, cp = self.tp, self.pp, self.replicas, self.cp
        where = f"--tp {tp} --pp {pp}" + (f" --cp {cp}" if cp != 1 else "") + (f" --replicas {r}" if r != 1 else "")
        if tp < 1 or pp < 1 or r < 1 or cp < 1:
            raise TpplanError(where, "sizes must be at least 1", "pass positive sizes")
        if self.gpus > cluster.world_size:
            raise TpplanError(
                where,
                f"needs {self.gpus} GPUs, topology {cluster.name} has {cluster.world_size} "
                f"({cluster.nodes} x {cluster.gpus_per_node})",
                "use a smaller TP/CP/PP, fewer replicas or a topology with more nodes",
            )
        g = cluster.gpus_per_node
        one = self.replica_gpus
        if r > 1 and g % one and one % g:  # replicas placed alike: each in a share of a node, or whole nodes
            raise TpplanError(
                where,
                f"a replica of {one} GPUs would straddle nodes of {g} GPUs, so the replicas would not be alike",
                f"use replicas of a divisor or a multiple of {g} GPUs",
            )
        if tp > g and tp % g:
            raise TpplanError(
                f"tp={tp}",
                f"a TP group larger than a node must fill whole nodes of {g} GPUs",
                f"use a multiple of {g}",
            )
        if self.cp_layers == "mla" and tp % cp:
            raise TpplanError(f"tp={tp} cp={cp} cp_layers=mla", "the CP group sits inside the TP group",
                              f"use a CP that divides {tp}")  # fmt: skip
        if self.ep is not None and (self.ep < 1 or tp % self.ep):
            raise TpplanError(f"EP {self.ep}", f"must divide TP {tp}", f"use a divisor of {tp}")
        return self


__all__ = ["Deployment", "Fabric"]
