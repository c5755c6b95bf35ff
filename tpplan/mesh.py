"""The mesh: the one deployment type, how many GPUs of a cluster a model runs on and how they split it.

Named axes, outermost first: `replicas` x PP `pp` x CP `cp` x TP `tp`. Two more sit inside the TP
group: EP `ep` splits the routed experts over it, and DP attention (a plan's choice,
`tpplan.plans.named.dp_attention`) runs attention on each TP rank's own requests. Ranks are ordered
replica, stage, CP, TP, so a TP group keeps consecutive GPUs and a replica its own block of
`replica_gpus` (a TP16 replica on nodes of 8 holds two whole nodes). With `cp_layers="mla"` the CP
group sits inside the TP group too (only MLA layers are token-sharded), so it adds no GPUs.

One object instead of loose ints, validated once against the cluster it runs on (`check`), so every
stage downstream can trust that the groups fit: a TP group larger than a node fills whole nodes, the
GPUs it needs exist, an EP group divides the TP group it splits the experts over, and `replicas`
identical copies each sit on GPUs of their own, placed alike on the nodes (so one replica's prices are
every replica's; the requests are spread over them by the deployment's request router, `router`:
`tpplan.engines.routing`).
Library errors name the fields (`tp=7`); the CLI writes them as its options (`cli.FLAG_OF`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from tpplan.errors import TpplanError

Axis = Literal["replicas", "pp", "cp", "tp", "ep"]
AXES: tuple[Axis, ...] = ("replicas", "pp", "cp", "tp", "ep")  # outermost first; EP inside TP
CP_RECURRENCE = ("scan", "serial")
CP_LAYERS = ("all", "mla")
CP_KV = ("engines", "sharded")


class Fabric(Protocol):
    """What a mesh is checked against: a `Cluster`, a `Topology`, or one replica's share of one."""

    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...

    @property
    def world_size(self) -> int: ...


@dataclass(frozen=True)
class Mesh:
    """`replicas` x (PP `pp` x CP `cp` x TP `tp`), routed experts split EP `ep` inside each TP group.
    CP: `cp` TP groups per stage, each on its share of the tokens (`layout.context_parallel`)."""

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
    # what spreads the requests over the replicas (`--router`): a router the engine release records, None its
    # default (`tpplan.engines.routing`, which the launch lines and the serving loop both read)
    router: str | None = None

    @property
    def replica_gpus(self) -> int:
        """GPUs one replica occupies (TP x CP x PP; `cp_layers="mla"`: the CP group is inside the TP group)."""
        return self.tp * self.cp_gpus * self.pp

    @property
    def cp_gpus(self) -> int:
        """The factor CP adds to a stage's GPUs: `cp`, or 1 where the CP group sits inside the TP group."""
        return self.cp if self.cp_layers == "all" else 1

    @property
    def gpus(self) -> int:
        """GPUs the mesh occupies, every replica's."""
        return self.replica_gpus * self.replicas

    def size(self, axis: Axis) -> int:
        """The group size along `axis` (EP: 1 when the experts are not split)."""
        return self.ep or 1 if axis == "ep" else int(getattr(self, axis))

    def stride(self, axis: Axis) -> int:
        """Rank distance between neighbours of one `axis` group (ranks are replica, stage, CP, TP)."""
        return {"tp": 1, "ep": 1, "cp": self.tp if self.cp_layers == "all" else 1,
                "pp": self.tp * self.cp_gpus, "replicas": self.replica_gpus}[axis]  # fmt: skip

    def group_ranks_per_node(self, axis: Axis, gpus_per_node: int) -> int:
        """Members of one `axis` group on one node of `gpus_per_node` GPUs (the rest are across the network)."""
        return max(1, min(self.size(axis), gpus_per_node // self.stride(axis)))

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes it uses on a cluster of `gpus_per_node` GPUs per node."""
        return math.ceil(self.gpus / gpus_per_node)

    def ranks_per_node(self, gpus_per_node: int) -> int:
        """TP ranks that share one node."""
        return min(self.tp, gpus_per_node)

    def label(self) -> str:
        """`TP8`, `TP8xPP4`, `TP8xCP4`, `2x TP16`: the mesh in words (CP: context parallelism; `2x`: two
        replicas of it, the requests split between them)."""
        one = f"TP{self.tp}" + (f"xCP{self.cp}" if self.cp > 1 else "") + (f"xPP{self.pp}" if self.pp > 1 else "")
        return f"{self.replicas}x {one}" if self.replicas > 1 else one

    def fields(self) -> str:
        """`tp=8 pp=2 cp=2 replicas=2`: the sizes as an error names them (1s left out but TP's and PP's)."""
        tp, pp, r, cp = self.tp, self.pp, self.replicas, self.cp
        return f"tp={tp} pp={pp}" + (f" cp={cp}" if cp != 1 else "") + (f" replicas={r}" if r != 1 else "")

    def check(self, cluster: Fabric) -> Mesh:
        """Itself, after checking it fits `cluster` (a `Cluster` or `Topology`); a TpplanError else."""
        tp, cp, where, g = self.tp, self.cp, self.fields(), cluster.gpus_per_node
        if min(tp, self.pp, self.replicas, cp) < 1:
            raise TpplanError(where, "sizes must be at least 1", "pass positive sizes")
        if self.gpus > cluster.world_size:
            raise TpplanError(
                where,
                f"needs {self.gpus} GPUs, topology {cluster.name} has {cluster.world_size} "
                f"({cluster.nodes} x {cluster.gpus_per_node})",
                "use a smaller TP/CP/PP, fewer replicas or a topology with more nodes",
            )
        one = self.replica_gpus
        if (
            self.replicas > 1 and g % one and one % g
        ):  # replicas placed alike: each in a share of a node, or whole nodes
            raise TpplanError(
                where,
                f"a replica of {one} GPUs would straddle nodes of {g} GPUs, so the replicas would not be alike",
                f"use replicas of a divisor or a multiple of {g} GPUs",
            )
        if tp > g and tp % g:
            raise TpplanError(
                f"tp={tp}", f"a TP group larger than a node must fill whole nodes of {g} GPUs", f"use a multiple of {g}"
            )
        self._check_inside_tp()
        return self

    def _check_inside_tp(self) -> None:
        """What holds on any cluster: an MLA-only CP and EP divide the TP group they sit in; known CP options."""
        tp, cp = self.tp, self.cp
        if self.cp_layers == "mla" and tp % cp:
            raise TpplanError(f"tp={tp} cp={cp} cp_layers=mla", "the CP group sits inside the TP group",
                              f"use a CP that divides {tp}")  # fmt: skip
        if self.ep is not None and (self.ep < 1 or tp % self.ep):
            raise TpplanError(f"EP {self.ep}", f"must divide TP {tp}", f"use a divisor of {tp}")
        for name, value, allowed in (
            ("cp_recurrence", self.cp_recurrence, CP_RECURRENCE),
            ("cp_layers", self.cp_layers, CP_LAYERS),
            ("cp_kv", self.cp_kv, CP_KV),
        ):
            if value not in allowed:
                raise TpplanError(f"{name}={value}", "is not a known CP option", f"use one of {', '.join(allowed)}")


__all__ = ["AXES", "Axis", "Fabric", "Mesh"]
