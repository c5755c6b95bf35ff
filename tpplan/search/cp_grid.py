"""The search's `--cp-layers mla` grid: each TP x PP split with a CP group inside its TP group.

Under `mla` (SGLang PR #38344's full-sequence CP, `tpplan.layout.context_parallel`) CP adds no GPU:
TP8 x CP8 runs on the TP group's 8 GPUs, the MLA attention at TP 8/8 = 1 on 1/8 of the queries. So
the grid is the CP 1 splits again, each with every CP size that divides its TP where the model has
MLA layers. It is asked for (`search --cp-layers mla`), not in the default grid, as replicas and
overlap are: each CP size is another grid of walks (K3 on 4x8 H200: 12 deployments, 9.6 s user CPU
at load 6, against the default's 5 s), and the default grid's points would have to carry the
layer set to hold both.
"""

from __future__ import annotations

from dataclasses import replace

from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import CP_SIZES, audit_cp
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.search.grid import MeshAsk


def mla_deployments(graph: ModelGraph, splits: list[Mesh], ask: MeshAsk) -> list[Mesh]:
    """Each of `splits` (CP 1 meshes of the search's grid) with the asked CP (default each of CP_SIZES above 1)
    inside its TP group, where CP divides TP and the model has MLA layers; TpplanError when none is."""
    cp = ask.cp
    sizes = (cp,) if cp is not None else CP_SIZES[1:]
    legal = [replace(m, cp=k) for m in splits for k in sizes if k > 1]
    out = [m for m in legal if audit_cp(graph, replace(m, cp_layers="mla")).legal]
    if not out:
        n, k = (splits[0].tp if splits else 1), sizes[0]
        why = audit_cp(graph, Mesh(n, cp=k, cp_layers="mla")).reasons or [f"CP {k} is not above 1"]
        raise TpplanError(f"cp_layers=mla cp={cp}", "; ".join(why), "search with cp_layers=all")
    return out


__all__ = ["mla_deployments"]
