"""Dev script: judge the shipped collective curves against measurements they were not built from.

`python -m tools.curve_check` (needs `aiconfigurator-core` for the other collections)
prints the tables of docs/benchmarks.md ("Collectives as measured curves"):

- other collection, out of sample: each cluster preset's price (its curves, or the link model where
  it has none) against another NCCL collection of the same system in AIC (H200: NCCL 2.26.2 and
  2.23; H100: 2.27.3 and 2.23; B300 and GB300: 2.27), measured in a separate run with another NCCL version;
- leave one size out, out of sample on the held-out row: each interior point of a shipped curve
  priced from the curve without it (so interpolation across a 4x gap), for the NCCL sets and,
  separately, the opt-in engine all-reduce sets;
- alpha-beta fallback, out of sample: a curve cut to 8-128 MiB prices the 1-4 MiB rows (latency
  term from its two smallest points) and the 256-512 MiB rows (its largest point's line);
- the independent 2 x H200 probe (tests/data/anchors/h200x2_nccl_probe.json: torch.distributed,
  NCCL 2.28.9, NVLS off), out of sample;
- in sample: the 1-4 MiB line whose intercept is each curve's latency term, at those rows;
- the NVLS-off 8-GPU ring derived from a table's 4-GPU curve (`aic_curves.ring8_points`), out of
  sample on the systems whose 8-GPU all-reduce is a measured ring (A100: NVSwitch without NVLS;
  the RTX PRO 6000 server: PCIe), and against the published NVLS-off figures at 8-16 GiB;
- across nodes (the published set h100x8-ndr400-nccl-2.26.2, NVIDIA/nccl-tests#309): leave one size
  out, and out of sample against another cluster's runs in that thread
  (tests/data/anchors/h100x8_allreduce_nccl_tests_309.json), with the link model beside it.

Errors are predicted / measured - 1 (medians of their size); size ranges are 1-4, 8-32 and 64-512 MiB.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

from tpplan.cost.cluster import CollectiveCurve
from tpplan.cost.collectives import collective_time, curve_latency_s, curve_time
from tpplan.cost.curve_sets import curve_set, list_curve_sets
from tpplan.cost.sources.aic_curves import RING_LL_MAX, SHIPPED, nccl_points, ring8_points
from tpplan.cost.topology import load_topology

MiB = 2**20
RANGES = (("1-4", 1 * MiB, 4 * MiB), ("8-32", 8 * MiB, 32 * MiB), ("64-512", 64 * MiB, 512 * MiB))
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
# (preset, AIC system, other NCCL collections of it)
PRESETS = (
    ("h200x8-ib400-nvls", "h200_sxm", ("2.26.2", "2.23")),
    ("h200x8-ib400", "h200_sxm", ("2.26.2",)),
    ("h100x8-ib400", "h100_sxm", ("2.27.3", "2.23")),
    ("b300x8-ib800", "b300_sxm", ("2.27",)),
    ("gb300-nvl72", "gb300", ("2.27",)),
)
ANCHOR = Path(__file__).resolve().parents[3] / "tests" / "data" / "anchors" / "h200x2_nccl_probe.json"
RING8_MEASURED = (("a100_sxm", "2.27.3"), ("rtx_pro_6000_server", "2.29.2"))  # 8-GPU all-reduce is a ring there
GiB = 2**30
PUBLISHED_NVLS_OFF = (  # (preset, bytes, busbw GB/s, where): 8-GPU all-reduce, NCCL_NVLS_ENABLE=0
    ("h200x8-ib400", 8 * GiB, 365.6, "stas00/ml-engineering network/README.md @744d01e1 (8x H200, NCCL 2.27.7)"),
    ("h200x8-ib400", 16 * GiB, 367.2, "stas00/ml-engineering network/README.md @744d01e1 (8x H200, NCCL 2.27.7)"),
    ("h100x8-ib400", 16 * GiB, 368.76, "NVIDIA/nccl-tests#309, qoofyk (8x H100, NCCL 2.26.2)"),
)
MULTINODE_SET = "h100x8-ndr400-nccl-2.26.2"
OTHER_CLUSTER = ANCHOR.with_name("h100x8_allreduce_nccl_tests_309.json")
ANCHOR_ROWS = (("ar_hidden", "all_reduce", 7168, 1), ("rs_hidden", "reduce_scatter", 7168, 1),
               ("ag_hidden", "all_gather", 7168, 1), ("ag_latent", "all_gather", 2112, 1),
               ("a2a_gate", "all_to_all", 12288, 2))  # fmt: skip

Row = tuple[str, str, int, str, float, float]  # (label, kind, ranks, range, predicted, measured)


def _range(nbytes: float) -> str | None:
    return next((name for name, lo, hi in RANGES if lo <= nbytes <= hi), None)


def _nearest_range(nbytes: float) -> str:
    """A size between the grid's ranges (the probe's widths) in the range it sits closest to."""
    return _range(nbytes) or ("1-4" if nbytes < 6 * MiB else "8-32" if nbytes < 48 * MiB else "64-512")


def other_collection() -> list[Row]:
    rows: list[Row] = []
    for preset, system, versions in PRESETS:
        topo = load_topology(preset, nodes=1)
        for version in versions:
            for (kind, ranks), pts in nccl_points(system, version).items():
                if ranks > topo.gpus_per_node:
                    continue
                for x, t in pts:
                    if (r := _range(x)) is not None:
                        est = collective_time(kind, x, ranks, topo)
                        rows.append((f"{preset} vs NCCL {version}", kind, ranks, r, est.time_s, t))
    return rows


def _short(name: str) -> str:
    """A set's name without its NCCL version (every shipped NCCL set is 2.29.2): the AIC system."""
    data = curve_set(name)
    if "aic_version" not in data:
        return name  # a published run
    return data["system"] if "nccl" in data else name.removesuffix("-allreduce")


def _curves(name: str) -> Iterable[CollectiveCurve]:
    return (CollectiveCurve.model_validate(c) for c in curve_set(name)["curves"])


def leave_one_size_out(names: Iterable[str]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        for c in _curves(name):
            for i in range(1, len(c.points) - 1):
                x, t = c.points[i]
                if (r := _range(x)) is not None:
                    rest = c.model_copy(update={"points": c.points[:i] + c.points[i + 1 :]})
                    rows.append((f"{_short(name)} leave-one-size-out", c.kind, c.ranks, r, curve_time(rest, x), t))
    return rows


def fallback(names: Iterable[str]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        for c in _curves(name):
            cut = c.model_copy(update={"points": [p for p in c.points if 8 * MiB <= p[0] <= 128 * MiB]})
            for x, t in c.points:
                if (x < 8 * MiB or x > 128 * MiB) and (r := _range(x)) is not None:
                    rows.append((f"{_short(name)} cut to 8-128 MiB", c.kind, c.ranks, r, curve_time(cut, x), t))
    return rows


def latency_fit_in_sample(names: Iterable[str]) -> list[Row]:
    """The least-squares line through the 1-4 MiB rows (its intercept is the latency term), at those rows."""
    rows: list[Row] = []
    for name in names:
        for c in _curves(name):
            pts = [(x, t) for x, t in c.points if MiB <= x <= 4 * MiB]
            mx, mt = statistics.fmean(x for x, _ in pts), statistics.fmean(t for _, t in pts)
            slope = sum((x - mx) * (t - mt) for x, t in pts) / sum((x - mx) ** 2 for x, _ in pts)
            alpha = curve_latency_s(c)
            label = f"{_short(name)} alpha-beta at 1-4 MiB"
            rows.extend((label, c.kind, c.ranks, "1-4", alpha + slope * x, t) for x, t in pts)
    return rows


def anchors() -> list[Row]:
    topo = load_topology("h200x8-ib400", nodes=1)
    rows: list[Row] = []
    for row in json.loads(ANCHOR.read_text())["rows"]:
        for key, kind, width, div in ANCHOR_ROWS:
            size = row["T"] * width * 2 / div
            r = _nearest_range(size)
            rows.append(("h200 curves vs 2xH200 probe", kind, 2, r, collective_time(kind, size, 2, topo).time_s,
                         row[key] * 1e-3))  # fmt: skip
    return rows


def ring8_derivation() -> list[Row]:
    """The derivation applied to systems whose measured 8-GPU all-reduce is a ring, at the sizes where
    the derived curve is the 4-GPU one (above 1 MiB): each predicted row against the measured one."""
    rows: list[Row] = []
    for system, nccl in RING8_MEASURED:
        eight = dict(nccl_points(system, nccl)[("all_reduce", 8)])
        for x, t in ring8_points(system, nccl)[0]:
            if x > RING_LL_MAX and (r := _range(x)) is not None:
                rows.append((f"ring8 derivation on {system} NCCL {nccl}", "all_reduce", 8, r, t, eight[x]))
    return rows


def published_nvls_off() -> str:
    """The NVLS-off presets' 8-GPU all-reduce busbw at the published sizes (above the curve's points:
    its tail line) against the published figure."""
    out = ["| preset | size | priced busbw | published | error | where |", "|---|---|---|---|---|---|"]
    for preset, size, busbw, where in PUBLISHED_NVLS_OFF:
        est = collective_time("all_reduce", size, 8, load_topology(preset, nodes=1))
        out.append(f"| {preset} | {size // GiB} GiB | {est.busbw_GBps:.1f} GB/s | {busbw} GB/s | "
                   f"{100 * (busbw / est.busbw_GBps - 1):+.1f}% | {where} |")  # fmt: skip
    return "\n".join(out)


def across_nodes() -> list[Row]:
    """The 16- and 32-GPU all-reduce (8 per node) of another cluster in nccl-tests#309, priced by the
    NVLS preset's published curves and by the link model the NVLS-off presets keep, and the set's own
    cluster priced by that link model. Measured = the smaller of out-of-place and in-place times."""
    rows: list[Row] = []
    other = json.loads(OTHER_CLUSTER.read_text())["rows"]
    own = curve_set(MULTINODE_SET)["raw"]
    cases = (("h200x8-ib400-nvls vs nccl-tests#309 other cluster", "h200x8-ib400-nvls", other),
             ("h200x8-ib400 link model vs nccl-tests#309 other cluster", "h200x8-ib400", other),
             ("h200x8-ib400 link model vs nccl-tests#309 curve set's cluster", "h200x8-ib400", own))  # fmt: skip
    for label, preset, table_rows in cases:
        for n, pts in table_rows.items():
            topo = load_topology(preset, nodes=int(n) // 8)
            for x, oop, ip in pts:
                if (r := _range(x)) is not None:
                    est = collective_time("all_reduce", x, int(n), topo, ranks_per_node=8)
                    rows.append((label, "all_reduce", int(n), r, est.time_s, min(oop, ip) * 1e-6))
    return rows


def table(rows: list[Row]) -> str:
    """Markdown, one table per label: median and worst error (%) per kind x GPUs and size range."""
    groups: dict[str, dict[tuple[str, int], dict[str, list[float]]]] = {}
    for label, kind, ranks, r, pred, meas in rows:
        groups.setdefault(label, {}).setdefault((kind, ranks), {}).setdefault(r, []).append(pred / meas - 1)
    out = []
    for label, by_curve in sorted(groups.items()):
        out += [f"{label}, median / worst error (%):", "", "| kind | GPUs | 1-4 MiB | 8-32 MiB | 64-512 MiB | all |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for (kind, ranks), by in sorted(by_curve.items(), key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1])):
            cells = [_cell(by.get(name, [])) for name, _, _ in RANGES]
            every = [abs(e) for errs in by.values() for e in errs]
            out.append(f"| {kind} | {ranks} | {' | '.join(cells)} | {100 * statistics.median(every):.1f} |")
        out.append("")
    return "\n".join(out)


def _cell(errs: list[float]) -> str:
    if not errs:
        return "-"
    return f"{100 * statistics.median(abs(e) for e in errs):.1f} / {100 * max(errs, key=abs):+.1f}"


def cell_summary(rows: list[Row]) -> str:
    """Per label: the largest cell median (kind x GPUs x size range) and how many cells exceed 10%."""
    cells: dict[str, dict[tuple[str, int, str], list[float]]] = {}
    for label, kind, ranks, r, pred, meas in rows:
        cells.setdefault(label, {}).setdefault((kind, ranks, r), []).append(abs(pred / meas - 1))
    out = ["| on | cells | largest cell median | cells over 10% median |", "|---|---|---|---|"]
    for label, by in sorted(cells.items()):
        meds = {k: statistics.median(v) for k, v in by.items()}
        worst = max(meds, key=meds.__getitem__)
        over = sum(m > 0.10 for m in meds.values())
        out.append(f"| {label} | {len(meds)} | {100 * meds[worst]:.1f}% ({worst[0]} {worst[1]} GPUs {worst[2]} MiB) "
                   f"| {over} |")  # fmt: skip
    return "\n".join(out)


def summary(rows: list[Row]) -> str:
    errs = [abs(p / m - 1) for *_, p, m in rows]
    return f"{len(errs)} rows: median {statistics.median(errs):.1%}, worst {max(errs):.1%}"


def main() -> None:
    engine_sets = [n for n in list_curve_sets() if n.endswith("-allreduce")]
    shipped = tuple(f"{system}-nccl-{nccl}" for system, nccl in SHIPPED)
    for title, rows in (
        ("Other collection (out of sample)", other_collection()),
        ("Leave one size out (out of sample)", leave_one_size_out(shipped)),
        ("Alpha-beta fallback, curve cut to 8-128 MiB (out of sample)", fallback(shipped)),
        ("Latency term at 1-4 MiB (in sample)", latency_fit_in_sample(shipped)),
        ("2 x H200 probe (out of sample)", anchors()),
        ("Engine all-reduce sets, leave one size out (out of sample)", leave_one_size_out(engine_sets)),
        ("NVLS-off 8-GPU ring derived from the 4-GPU curve (out of sample)", ring8_derivation()),
        ("Across nodes: published set, leave one size out (out of sample)", leave_one_size_out([MULTINODE_SET])),
        ("Across nodes: another cluster, and the link model (out of sample)", across_nodes()),
    ):
        print(f"### {title}: {summary(rows)}\n\n{cell_summary(rows)}\n\n{table(rows)}\n")
    print(f"### NVLS-off 8-GPU all-reduce at published sizes (out of sample)\n\n{published_nvls_off()}\n")


if __name__ == "__main__":
    main()
