"""Time of one collective on a topology: an alpha-beta model per algorithm, fastest wins.

Sizes follow nccl-tests' "size" convention so predictions compare directly with its tables:
all_reduce = the buffer, all_gather = the gathered output, reduce_scatter = the full input,
all_to_all = one rank's whole send buffer, send_recv = the message. See docs/cost-model.md.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from functools import cache

from tpplan.cost.topology import AllReduceAlgorithm, CollectiveCurve, FittedCollective, Topology
from tpplan.errors import TpplanError
from tpplan.lower.sizes import bus_factor, check_kind

_GB = 1e9
_US = 1e-6


def ring_steps(kind: str, n: int) -> int:
    """Latency-bound steps of the one-node algorithm: ring for reductions/gathers, else 1."""
    if n <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind in ("reduce_scatter", "all_gather"):
        return n - 1
    return 1


@dataclass(frozen=True)
class CollectiveEstimate:
    """Predicted time of one collective, with nccl-tests' algbw and busbw for comparison."""

    kind: str
    nbytes: float
    group_size: int
    time_s: float
    algorithm: str
    algbw_GBps: float
    busbw_GBps: float
    candidates: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Links:
    launch: float  # s
    a_i: float  # s per intra hop/step
    b_i: float  # bytes/s intra per GPU per direction
    a_x: float  # s per inter hop
    b_x: float  # bytes/s egress of one node usable by this group
    b_nic: float  # bytes/s of one NIC
    ar_algos: tuple[AllReduceAlgorithm, ...] = ()  # declared intra-node all-reduce algorithms


def _links(topo: Topology, rpn: int, fit: FittedCollective | None, kind: str) -> _Links:
    a_i = topo.intra.latency_us * _US
    b_i = topo.intra.bandwidth_GBps * _GB
    launch = topo.launch_us * _US
    if fit is not None:
        # Multi-node extrapolation: the calibrated one-node constants replace the intra link;
        # the per-call overhead is what the fit's alpha leaves after its ring steps.
        b_i = fit.busbw_GBps * _GB
        launch = max(0.0, fit.alpha_us * _US - ring_steps(kind, fit.group_size) * a_i)
    algos = tuple(topo.intra.all_reduce) if fit is None else ()
    if topo.inter is None:
        return _Links(launch, a_i, b_i, math.inf, 0.0, 0.0, algos)
    inter = topo.inter
    # Rail-optimised nodes: a group with rpn of the node's GPUs reaches its share of the NICs.
    nics = max(1, min(inter.nics_per_node, round(inter.nics_per_node * rpn / topo.gpus_per_node)))
    return _Links(launch, a_i, b_i, inter.latency_us * _US, nics * inter.nic_GBps * _GB, inter.nic_GBps * _GB, algos)


def _candidates(kind: str, s: float, n: int, rpn: int, m: int, ln: _Links) -> dict[str, float]:
    """Time in seconds of every algorithm NCCL could pick for this collective."""
    L, a_i, b_i, a_x, b_x = ln.launch, ln.a_i, ln.b_i, ln.a_x, ln.b_x
    if m == 1:
        if kind == "all_reduce":
            cands = {"ring": L + 2 * (n - 1) * a_i + 2 * (n - 1) / n * s / b_i}
            for alg in ln.ar_algos:
                fits_size = alg.max_bytes is None or s <= alg.max_bytes
                if fits_size and alg.min_ranks <= n and (alg.max_ranks is None or n <= alg.max_ranks):
                    cands[alg.name] = L + alg.latency_us * _US + 2 * (n - 1) / n * s / (alg.busbw_GBps * _GB)
            return cands
        if kind in ("reduce_scatter", "all_gather"):
            return {"ring": L + (n - 1) * a_i + (n - 1) / n * s / b_i}
        if kind == "all_to_all":
            return {"direct": L + a_i + (n - 1) / n * s / b_i}
        return {"direct": L + a_i + s / b_i}
    b_ring = min(b_i, b_x)  # a ring's bytes per step leave the node once: node egress vs NVLink
    if kind == "all_reduce":
        ring = L + 2 * (n - 1) * a_x + 2 * (n - 1) / n * s / b_ring
        tree_lat = 2 * (math.ceil(math.log2(m)) * a_x + (rpn - 1) * a_i)
        tree = L + tree_lat + 2 * s / b_ring
        hier = (
            L
            + 2 * ((rpn - 1) * a_i + (rpn - 1) / rpn * s / b_i)  # intra RS + intra AG
            + 2 * (m - 1) * a_x
            + 2 * (m - 1) / m * s / b_x  # rpn concurrent inter-node ARs of s/rpn share egress
        )
        return {"ring": ring, "tree": tree, "hierarchical": hier}
    if kind in ("reduce_scatter", "all_gather"):
        return {"ring": L + (n - 1) * a_x + (n - 1) / n * s / b_ring}
    if kind == "all_to_all":
        intra = (rpn - 1) / n * s / b_i  # one rank's bytes to its node-local peers
        inter = rpn * (n - rpn) / n * s / b_x  # the node's bytes to other nodes
        return {"direct": L + a_x + max(intra, inter)}
    return {"direct": L + a_x + s / min(b_i, ln.b_nic)}  # one message crosses one NIC


def _interpolate_curve(fit: FittedCollective, nbytes: float, group_size: int) -> float | None:
    """Log-log interpolation between calibrated points, or None outside them (or another group size)."""
    pts = fit.curve
    if group_size != fit.group_size or len(pts) < 2 or not pts[0][0] <= nbytes <= pts[-1][0]:
        return None
    for (x0, t0), (x1, t1) in itertools.pairwise(pts):
        if x0 <= nbytes <= x1:
            if x1 == x0:
                return t0
            w = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
    return None


LATENCY_FIT_BYTES = (2**20, 4 * 2**20)  # the rows a curve's latency term is fitted to: 1-4 MiB


@cache
def _latency_fit(points: tuple[tuple[float, float], ...]) -> float:
    pts = [(x, t) for x, t in points if LATENCY_FIT_BYTES[0] <= x <= LATENCY_FIT_BYTES[1]]
    if len(pts) < 2:
        pts = list(points[:2])  # no 1-4 MiB rows: the two smallest points
    n = len(pts)
    mx, mt = sum(x for x, _ in pts) / n, sum(t for _, t in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (t - mt) for x, t in pts) / sxx if sxx > 0 else 0.0
    alpha = mt - slope * mx if slope > 0 else min(t for _, t in pts)
    return min(max(0.0, alpha), min(t for _, t in pts))


def curve_latency_s(curve: CollectiveCurve) -> float:
    """A curve's latency term alpha (seconds): the intercept of the least-squares line
    time = alpha + size / B through its 1-4 MiB points (the two smallest points where it has no
    1-4 MiB rows), clamped to [0, their smallest time]. Cached on the points' values."""
    return _latency_fit(tuple((float(x), float(t)) for x, t in curve.points))


def curve_time(curve: CollectiveCurve, nbytes: float) -> float:
    """A measured curve at `nbytes`: log-log between its points; outside them the alpha-beta line
    alpha + size / B with alpha fitted to the 1-4 MiB points (`curve_latency_s`) and B chosen so the
    line meets the nearest end point, so the price is continuous there."""
    pts = curve.points
    alpha = curve_latency_s(curve)
    (x_lo, t_lo), (x_hi, t_hi) = pts[0], pts[-1]
    if nbytes <= x_lo:
        return alpha + nbytes * (t_lo - alpha) / x_lo if t_lo > alpha else t_lo
    if nbytes >= x_hi:
        return alpha + nbytes * (t_hi - alpha) / x_hi if t_hi > alpha else t_hi * nbytes / x_hi
    i = bisect.bisect_left(pts, nbytes, key=lambda p: p[0])  # pts[i - 1][0] < nbytes <= pts[i][0]
    (x0, t0), (x1, t1) = pts[i - 1], pts[i]
    w = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))


CURVE_SUFFIX = "-curve"  # a measured curve's algorithm, as a prediction names it ("nvls-curve")


def _curves(topo: Topology, kind: str, nbytes: float, n: int, rpn: int) -> dict[str, float]:
    """Time per algorithm of the topology's measured curves for this kind, group and placement."""
    out: dict[str, float] = {}
    for c in topo.curves:
        if c.kind == kind and c.ranks == n and (c.ranks_per_node or min(n, topo.gpus_per_node)) == rpn:
            out[f"{c.algorithm}{CURVE_SUFFIX}"] = curve_time(c, nbytes)
    return out


def _placement(
    kind: str, nbytes: float, group_size: int, topo: Topology, ranks_per_node: int | None
) -> tuple[int, int]:
    """The checked arguments of `collective_time`: ranks per node, and how many nodes the group spans."""
    check_kind(kind)
    if nbytes < 0:
        raise TpplanError("nbytes", f"must be >= 0, got {nbytes}", "pass a message size in bytes")
    if group_size < 1:
        raise TpplanError("group_size", f"must be >= 1, got {group_size}", "use a positive group")
    rpn = ranks_per_node if ranks_per_node is not None else min(group_size, topo.gpus_per_node)
    if not 1 <= rpn <= topo.gpus_per_node or group_size % rpn:
        raise TpplanError(
            "ranks_per_node",
            f"{rpn} does not divide group_size {group_size} or exceeds gpus_per_node {topo.gpus_per_node}",
            "use a divisor of the group size that fits on one node",
        )
    m = group_size // rpn
    if m > topo.nodes:
        raise TpplanError(
            "group_size",
            f"{group_size} ranks at {rpn} per node need {m} nodes, topology {topo.name} has {topo.nodes}",
            "use a smaller group, more ranks per node, or nodes=",
        )
    return rpn, m


def collective_time(
    kind: str,
    nbytes: float,
    group_size: int,
    topo: Topology,
    *,
    ranks_per_node: int | None = None,
    algorithm: str | None = None,
) -> CollectiveEstimate:
    """Predict one collective of `nbytes` (nccl-tests size) over `group_size` ranks.

    A group spanning nodes puts `ranks_per_node` (default min(group_size, gpus_per_node)) on each.
    Measured `topo.curves` for this kind, group and placement price it first (fastest algorithm,
    as NCCL's tuner picks); then calibrated constants in `topo.fitted` replace the link model for
    one-node groups. `algorithm` asks for one algorithm by name (ring, tree, nvls, ...).
    """
    rpn, m = _placement(kind, nbytes, group_size, topo, ranks_per_node)
    if group_size == 1 or nbytes == 0:
        return CollectiveEstimate(kind, nbytes, group_size, 0.0, "none", 0.0, 0.0, {})
    fit = topo.fitted.get(kind)  # type: ignore[call-overload]  # kind: a Collective value, typed str
    measured = _curves(topo, kind, float(nbytes), group_size, rpn) if topo.curves else {}
    fitted_curve = _interpolate_curve(fit, nbytes, group_size) if fit is not None and m == 1 else None
    if algorithm is not None and f"{algorithm}{CURVE_SUFFIX}" in measured:
        algorithm = f"{algorithm}{CURVE_SUFFIX}"
    if measured and (algorithm is None or algorithm in measured):
        cands = measured
    elif fitted_curve is not None:
        cands = {"measured-curve": fitted_curve}
    elif fit is not None and m == 1:
        extra_steps = ring_steps(kind, group_size) - ring_steps(kind, fit.group_size)
        alpha = fit.alpha_us * _US + extra_steps * topo.intra.latency_us * _US
        beta = bus_factor(kind, group_size) * nbytes / (fit.busbw_GBps * _GB)
        cands = {"fitted": max(0.0, alpha) + beta}
    else:
        cands = _candidates(kind, float(nbytes), group_size, rpn, m, _links(topo, rpn, fit, kind))
    if algorithm is not None:
        if algorithm not in cands:
            raise TpplanError(f"algorithm {algorithm!r}", f"not available for {kind} on {group_size} ranks of "
                              f"{topo.name}", f"use one of {', '.join(sorted(cands))}")  # fmt: skip
        cands = {algorithm: cands[algorithm]}
    algorithm = min(cands, key=cands.__getitem__)
    t = cands[algorithm]
    algbw = nbytes / t / _GB
    return CollectiveEstimate(
        kind=kind,
        nbytes=nbytes,
        group_size=group_size,
        time_s=t,
        algorithm=algorithm,
        algbw_GBps=algbw,
        busbw_GBps=algbw * bus_factor(kind, group_size),
        candidates=cands,
    )
