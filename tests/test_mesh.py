"""`tpplan.mesh.Mesh`, the one deployment type: its axes, group sizes, placement on nodes, label and
the one check against a cluster (errors name fields, and the CLI writes them as its options)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tpplan.cli import as_flags
from tpplan.errors import TpplanError
from tpplan.mesh import AXES, Mesh


@dataclass(frozen=True)
class Nodes:
    """A cluster of `nodes` x `gpus_per_node`, the least a mesh is checked against (`tpplan.mesh.Fabric`)."""

    nodes: int
    gpus_per_node: int = 8
    name: str = "test"

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def test_axes_sizes_and_strides_follow_the_rank_order():
    """Ranks are replica, stage, CP, TP: TP neighbours are 1 apart, CP neighbours a TP group apart, stages a
    CP x TP block apart, replicas a whole replica apart; EP splits the experts inside the TP group."""
    m = Mesh(4, pp=2, cp=2, replicas=3, ep=2)
    assert [m.size(a) for a in AXES] == [3, 2, 2, 4, 2]
    assert [m.stride(a) for a in AXES] == [16, 8, 4, 1, 1]
    assert (m.replica_gpus, m.gpus, m.nodes(8)) == (16, 48, 6)
    assert Mesh(8).size("ep") == 1


def test_an_mla_only_cp_group_sits_inside_the_tp_group():
    m = Mesh(8, cp=4, cp_layers="mla")
    assert (m.replica_gpus, m.cp_gpus, m.stride("cp")) == (8, 1, 1)
    assert m.group_ranks_per_node("cp", 8) == 4


def test_group_members_on_one_node():
    """TP16 on nodes of 8: 8 TP ranks per node, one stage per pair of nodes; TP2 x CP4 on nodes of 4: two
    of the four CP ranks share a node, the other two are across the network."""
    assert Mesh(16, pp=2).group_ranks_per_node("tp", 8) == Mesh(16).ranks_per_node(8) == 8
    assert Mesh(16, pp=2).group_ranks_per_node("pp", 8) == 1
    assert Mesh(2, cp=4).group_ranks_per_node("cp", 4) == 2
    assert Mesh(2, pp=2).group_ranks_per_node("pp", 8) == 2


def test_label_names_the_axes_that_are_not_one():
    assert [m.label() for m in (Mesh(8), Mesh(8, pp=4), Mesh(8, cp=4), Mesh(16, replicas=2))] == [
        "TP8", "TP8xPP4", "TP8xCP4", "2x TP16",
    ]  # fmt: skip


def test_check_passes_a_mesh_that_fits_and_returns_it():
    m = Mesh(16, replicas=2)
    assert m.check(Nodes(4)) is m
    assert Mesh(4, replicas=2).check(Nodes(1)).gpus == 8  # two replicas share one node


@pytest.mark.parametrize(
    ("mesh", "nodes", "shown"),
    [
        (Mesh(32, pp=2), 4, "--tp 32 --pp 2: needs 64 GPUs, topology test has 32 (4 x 8)"),
        (Mesh(4, pp=3, replicas=2), 3, "--tp 4 --pp 3 --replicas 2: a replica of 12 GPUs would straddle nodes"),
        (Mesh(12), 2, "--tp 12: a TP group larger than a node must fill whole nodes of 8 GPUs"),
        (Mesh(8, replicas=0), 1, "--tp 8 --pp 1 --replicas 0: sizes must be at least 1"),
        (Mesh(8, cp=3, cp_layers="mla"), 1, "--tp 8 --cp 3 --cp-layers mla: the CP group sits inside the TP group"),
        (Mesh(8, ep=3), 1, "EP 3: must divide TP 8"),
        (Mesh(8, cp_kv="half"), 1, "--cp-kv half: is not a known CP option. Fix: use one of engines, sharded"),
    ],
)
def test_check_refuses_in_one_line_naming_fields(mesh, nodes, shown):
    with pytest.raises(TpplanError) as err:
        mesh.check(Nodes(nodes))
    assert "--" not in err.value.where  # the library names fields; the CLI writes its options
    assert str(as_flags(err.value)).startswith(shown)
