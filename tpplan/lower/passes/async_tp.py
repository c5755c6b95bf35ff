"""Async TP (`plan.overlap == "asynctp"`, torch's fused ops, `tpplan.engines.async_tp`): each token
all-gather fused with the GEMMs that read its output, each reduce-scatter with the row-split GEMM that
produced it (`layout.fused_gemm.fused_pairs`), within a pipeline stage (a reduce-scatter whose GEMM
ran in the stage before stays unfused). The program names the pairs; the cost model prices each as its
chunk pipeline (`tpplan.cost.async_tp`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.layout.fused_gemm import fused_pairs
from tpplan.lower.program import FusedPair, Program
from tpplan.lower.registry import Pass, register

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def _program(ctx: Lowering, prog: Program) -> Program:
    if ctx.plan.overlap != "asynctp":
        return prog
    pairs: list[FusedPair] = []
    for stage in prog.stages:
        prev = None
        for layer in stage.layers:
            res = ctx.results[layer.index]
            replaced = set(ctx.cp_audit.kinds[res.kind].replaces)  # `--cp-layers mla`: not run, so not fused
            for p in fused_pairs(res, prev):
                if res.comms[p.comm].value in replaced:
                    continue
                src = prev if p.from_previous and prev is not None else res
                gemms = tuple(src.decisions[i].op.name for i in p.gemms)
                pairs.append(FusedPair(layer.index, p.pattern, res.comms[p.comm].value, gemms, p.from_previous))
            prev = res
    return replace(prog, fused=tuple(pairs))


ASYNC_TP = register(Pass("async_tp", 70, "async TP: which collectives run fused with which GEMMs", program=_program))

__all__ = ["ASYNC_TP"]
