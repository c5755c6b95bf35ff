"""Kernel profiles from bench runs: how fast the non-GEMM kernels that really ran are.

The cost model prices norms, short convs, the attention residual, attention and the KDA/GDN
recurrences from a roofline with assumed efficiencies. Whatever kernels a runtime really uses
(fused Triton ones in a serving engine, plain torch in tpplan's own runtime) run at their own
fraction of that roofline, which no constant captures. `tpplan calibrate --kernels-from` reads the
ops of a bench run (the model's estimate and the measured time of each) and writes one curve per
kernel class into the topology's GPU, as `tpplan calibrate` does for collectives. The prediction
then maps each op's estimate through its curve (`KernelProfile.apply`).

The run it is fitted on should not be the run it is judged on: `docs/benchmarks.md` fits on a
token-count sweep (1K-16K tokens, one plan) and checks on the seed's 8K batches for every plan.
No torch here.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

from tpplan.bench_results import BenchResults
from tpplan.cost.topology import KernelProfile, Topology
from tpplan.errors import TpplanError
from tpplan.models.opkinds import kernel_key

MERGE_TOLERANCE = 0.02  # estimates closer than this (relative) are one point: their median is kept


def _op_kernels(model: str) -> dict[tuple[str, str], str | None]:
    """(layer kind, op name) -> kernel class, for results files written before ops carried it."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    graph = build_model_graph(load_model(model))
    return {(lk, op.name): kernel_key(op) for lk, lg in graph.kinds.items() for op in lg.ops}


def profile_samples(results: Sequence[BenchResults]) -> dict[str, list[tuple[float, float]]]:
    """(modelled s, measured s) of every profiled op, keyed by kernel class and by 'class:op name'.

    An op's modelled time is `modelled_s`, or `predicted_s` in files written before kernel profiles
    existed (their predictions were the roofline estimates of the cost model of that day). The curve
    is tied to the estimate it was fitted against: refit (instant) after changing the model's
    efficiency constants.
    """
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for res in results:
        lookup: dict[tuple[str, str], str | None] | None = None
        for o in res.ops:
            kernel = o.kernel
            if kernel is None and o.modelled_s is None:  # an older file: the graph says
                if lookup is None:
                    lookup = _op_kernels(res.model)
                kernel = lookup.get((o.layer_kind, o.op))
            modelled = o.estimate_s
            if kernel is None or not modelled or modelled <= 0:
                continue
            out[kernel].append((modelled, o.measured_s))
            out[f"{kernel}:{o.op}"].append((modelled, o.measured_s))
    return dict(out)


def curve(samples: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted points with near-equal estimates merged (geometric mean estimate, median measurement)."""
    pts = sorted(samples)
    out: list[tuple[float, float]] = []
    group: list[tuple[float, float]] = []
    for p in pts:
        if group and p[0] > group[0][0] * (1 + MERGE_TOLERANCE):
            out.append(_merge(group))
            group = []
        group.append(p)
    if group:
        out.append(_merge(group))
    return out


def _merge(group: list[tuple[float, float]]) -> tuple[float, float]:
    x = math.exp(statistics.fmean(math.log(g[0]) for g in group))
    return x, statistics.median(g[1] for g in group)


def fit_kernel_profiles(results: Sequence[BenchResults], source: str) -> dict[str, KernelProfile]:
    """One profile per kernel class and per (class, op name) found in `results`."""
    samples = profile_samples(results)
    if not samples:
        raise TpplanError(
            "kernels_from=",
            "the results files hold no timed non-GEMM ops with an estimate",
            "pass results of `tpplan bench` (a run with ops timed, e.g. workload=kernel-sweep)",
        )
    return {
        key: KernelProfile(points=curve(pts), samples=len(pts), source=source) for key, pts in sorted(samples.items())
    }


def with_kernel_profiles(topo: Topology, profiles: dict[str, KernelProfile], note: str = "") -> Topology:
    """`topo` with its GPU's kernel profiles replaced by `profiles`."""
    gpu = topo.gpu.model_copy(update={"kernel_profiles": profiles})
    notes = "; ".join(x for x in (topo.notes.rstrip(". "), note) if x) if note else topo.notes
    return topo.model_copy(update={"gpu": gpu, "notes": notes})


__all__ = ["curve", "fit_kernel_profiles", "profile_samples", "with_kernel_profiles"]
