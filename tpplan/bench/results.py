"""`tpplan bench` results: measurements and the predictions for the same slice and shapes -> `BenchResults`.

The parent process turns rank 0's combined measurements into one `BenchResults` per plan
(docs/bench-json.md), with the cost model's predictions for the same slice, shapes and topology
beside them (`cost.predict`), and writes them all or nothing. Ops and layers are the mean over
the workload's batches of each step's median over the timed passes; collectives the median over
every occurrence.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpplan import bench_results as schema
from tpplan.bench.config import (
    DTYPE_SHORT,
    SHORT,
    BenchConfig,
    impl_class,
    kernel_impls,
    op_category,
    op_kind_name,
)
from tpplan.bench.model_slice import ModelSlice, build_slice
from tpplan.bench.ttft import extrapolate_ttft
from tpplan.bench_results import (
    BatchResult,
    BenchMeta,
    BenchResults,
    CollectiveResult,
    LayerResult,
    OpResult,
    parse_bench_results,
)
from tpplan.cost.workload import Workload, load_workload, schedule
from tpplan.mesh import Mesh


@dataclass
class PlanBench:
    """One plan's results file and what the markdown and the checks need beyond it."""

    plan: str
    results: BenchResults
    runtime_s: dict[int, float]  # collective entry index -> replay through the runtime's Comm
    batch_contexts: dict[int, str]
    fallbacks: list[str]
    trace: list[Any]
    kernels: str = ""


def _coll_label(sl: ModelSlice, plan: Any, world: int, layer: int, value: str, kind: str) -> str:
    from tpplan.layout.schedule import layer_results

    n_layers = sl.graph.spec.num_layers
    if layer >= n_layers:
        return f"{SHORT.get(kind, kind)} final[{sl.graph.hidden}]"
    for c in layer_results(sl.graph, plan, world)[layer].comms:
        if c.value == value and c.collective.value == kind:
            return c.label
    return f"{SHORT.get(kind, kind)} {value}"


def build_results(cfg: BenchConfig, wl: Workload, raw: dict[str, Any], world: int, backend: str) -> list[PlanBench]:
    """Measurements + predictions for the same slice and shapes -> one `BenchResults` per plan."""
    from tpplan.cost.predict import Predictor
    from tpplan.cost.topology import load_topology

    sl = build_slice(cfg.model, cfg.layers, raw["experts"])
    g = sl.graph
    topo = load_topology(cfg.topology)
    inputs = recorded_inputs(cfg)
    dtype = raw["dtype"]
    batches = {b.index: b for b in schedule(wl)}
    contexts = {b.index: ",".join(str(s.start_pos) for s in b.segments) for b in batches.values()}  # every plan's
    out = []
    for name, pr in raw["plans"].items():
        plan = pr["plan"]
        impls = _ran_impls(g, pr["sites"], raw.get("impls", {}))
        p = Predictor(g, plan, topo, Mesh(world), dtype, None, impls=impls)  # not cached: this run's kernels
        op_acc, layer_acc, coll_acc, batch_rows = _sites(g, p, batches, pr["sites"])
        ops = _op_results(g, op_acc, pr["iters"], raw.get("impls", {}))
        layers = _layer_results(layer_acc, pr["iters"])
        colls, runtime_s = _collective_results(sl, plan, world, topo, coll_acc)
        ttft = []
        if cfg.target_topology is not None:
            ttft.append(extrapolate_ttft(cfg, wl, sl, name, ops, colls))
        meta = _meta(cfg, raw, world)
        res = BenchResults(
            schema_version=schema.BENCH_SCHEMA_VERSION,
            meta=meta,
            model=cfg.model,
            plan=name,
            tp=world,
            workload=cfg.workload,
            topology=cfg.topology,
            model_slice=schema.ModelSlice(
                description=sl.description,
                layer_kinds=g.counts(),
                experts=sl.experts,
                hidden=g.hidden,
                sized=raw.get("fit_note") or None,
            ),
            collectives=colls,
            ops=ops,
            layers=layers,
            batches=_batch_results(batch_rows, pr["iters"]),
            ttft=ttft,
            runtime_overhead=_overhead(pr.get("overhead")),
            inputs=inputs,
            timing=schema.OpTiming.model_validate(pr["timing"]) if pr.get("timing") else None,
        )
        out.append(PlanBench(name, res, runtime_s, contexts, pr["fallbacks"], pr["trace"], _kernels_note(cfg, raw)))
    return out


def _batch_results(batch_rows: list[tuple[Any, float, float]], iters: int) -> list[BatchResult]:
    """Each batch (`_sites`' rows: the batch, its measured and predicted seconds) in order, as the results file
    lists it: a measured time is at least 1 ns."""
    return [
        BatchResult(
            index=b.index,
            tokens=b.n_tokens,
            requests=sorted({s.request_id for s in b.segments}),
            measured_s=max(m, 1e-9),
            predicted_s=pred,
            iters=iters,
        )
        for b, m, pred in sorted(batch_rows, key=lambda x: x[0].index)
    ]


def _ran_impls(g: Any, sites: list[dict[str, Any]], impls: dict[str, str]) -> dict[str, str]:
    """The kernel implementations of the ops this plan's run timed, as `repredict_one` rebuilds them from
    the written op rows (`config.kernel_impls`), so the run-time prediction is the re-prediction."""
    ran = {(g.layer_kinds[s["layer"]], s["name"]) for s in sites if s["kind"] not in ("batch", "coll", "none", "layer")}
    return kernel_impls(g, ((lk, op, impls.get(impl_class(g, lk, op))) for lk, op in sorted(ran)))


def _sites(g: Any, p: Any, batches: dict[int, Any], sites: list[dict[str, Any]]) -> tuple[Any, Any, Any, Any]:
    """The measured sites sorted by what they timed, each beside its prediction: per (kind, op,
    tokens), per (kind, tokens), per collective site, and per batch."""
    results = p.audit.layer_results
    op_acc: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
    layer_acc: dict[tuple[str, int], list[Any]] = defaultdict(list)
    batch_rows = []
    coll_acc: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for s in sites:
        kind = s["kind"]
        if kind == "batch":
            b = batches[s["batch"]]
            segs = tuple((x.n_tokens, x.start_pos) for x in b.segments)
            batch_rows.append((b, statistics.median(s["seconds"]), p.latency(segs)))
            continue
        b = batches[s["batch"]]
        seg = b.segments[s["seg"]]
        segs1 = ((seg.n_tokens, seg.start_pos),)
        if kind == "none" or s.get("dtype") == "int64":
            continue  # identity with one rank; MoE count exchange (int64: not a schema dtype, 8 B per rank)
        if kind == "coll":
            lk = g.layer_kinds[s["layer"]] if s["layer"] < g.spec.num_layers else None
            key = (lk, s["value"], s["coll"], s["shape"], s["dtype"])
            coll_acc[key].append(s)
            continue
        lk = g.layer_kinds[s["layer"]]
        kt = p.kind_time(results[s["layer"]], segs1)
        med = statistics.median(s["seconds"])
        comm = statistics.median(s["comm_s"])
        if kind == "layer":
            layer_acc[(lk, seg.n_tokens)].append((med, comm, kt.total_s))
        else:
            opt = next(o for o in kt.ops if o.op == s["name"])
            op_acc[(lk, s["name"], seg.n_tokens)].append((med - comm, opt))
    return op_acc, layer_acc, coll_acc, batch_rows


def _op_results(
    g: Any, op_acc: dict[tuple[str, str, int], list[Any]], iters: int, impls: dict[str, str]
) -> list[OpResult]:
    """One row per (layer kind, op, tokens): the mean measured compute time beside the mean prediction."""
    ops = []
    for (lk, op_name, tokens), vals in op_acc.items():
        meas = statistics.fmean(max(v[0], 1e-9) for v in vals)
        pred = statistics.fmean(v[1].seconds for v in vals)
        modelled = statistics.fmean(v[1].modelled_s or 0.0 for v in vals)
        o0 = vals[0][1]
        ops.append(
            OpResult(
                layer_kind=lk,
                op=op_name,
                category=op_category(op_kind_name(g, lk, op_name), o0.category),
                tokens=tokens,
                flops=o0.flops_per_rank,
                measured_s=meas,
                predicted_s=pred if pred > 0 else None,
                iters=iters,
                kernel=o0.kernel,
                modelled_s=modelled if modelled > 0 else None,
                impl=impls.get(impl_class(g, lk, op_name)),
                source=o0.source,
                band=o0.band,
            )
        )
    return ops


def _layer_results(layer_acc: dict[tuple[str, int], list[Any]], iters: int) -> list[LayerResult]:
    """One row per (layer kind, tokens): measured time, its collective share, and the prediction."""
    layers = []
    for (lk, tokens), vals in layer_acc.items():
        meas = statistics.fmean(v[0] for v in vals)
        comm = statistics.fmean(v[1] for v in vals)
        layers.append(
            LayerResult(
                layer_kind=lk,
                tokens=tokens,
                measured_s=meas,
                predicted_s=statistics.fmean(v[2] for v in vals),
                comm_measured_s=comm,
                compute_measured_s=max(meas - comm, 0.0),
                iters=iters,
            )
        )
    return layers


def _collective_results(
    sl: Any, plan: Any, world: int, topo: Any, coll_acc: dict[tuple[Any, ...], list[Any]]
) -> tuple[list[CollectiveResult], dict[int, float]]:
    """One row per collective site with the link model's price, and the runtime-replay time of each
    row that has one (by row index)."""
    from tpplan.cost.collectives import collective_time

    rpn = min(world, topo.gpus_per_node)
    colls = []
    runtime_s: dict[int, float] = {}
    for key, group in coll_acc.items():
        lk, value, kind, shape, dt = key
        secs = [x for s in group for x in s["seconds"]]
        nbytes = group[0]["bytes"]
        est = collective_time(kind, float(nbytes), world, topo, ranks_per_node=rpn)
        rep = next((s["replay"] for s in group if s.get("replay")), None)
        colls.append(
            CollectiveResult(
                kind=kind,
                label=_coll_label(sl, plan, world, group[0]["layer"], value, kind),
                layer_kind=lk,
                shape=list(shape),
                dtype=DTYPE_SHORT.get(dt, "fp32"),
                bytes=nbytes,
                group_size=world,
                measured_s=max(statistics.median(secs), 1e-9),
                predicted_s=est.time_s,
                iters=len(secs),
                algorithm=est.algorithm,
                direct_s=max(rep[1], 1e-9) if rep else None,
                replay_s=max(rep[0], 1e-9) if rep else None,
            )
        )
        if rep:
            runtime_s[len(colls) - 1] = rep[0]
    return colls, runtime_s


def _meta(cfg: BenchConfig, raw: dict[str, Any], world: int) -> BenchMeta:
    """Where and with what the run was measured."""
    import socket

    return BenchMeta(
        machine=socket.gethostname() or "unknown",
        gpu=raw["gpu"] or "unknown",
        gpu_uuids=raw.get("gpu_uuids") or None,
        gpus=world,
        date=datetime.now(UTC).replace(microsecond=0),
        command=cfg.command,
        torch_version=raw["torch_version"],
        nccl_version=raw["nccl_version"],
        cuda_version=raw["cuda_version"],
        tpplan_version=_version(),
    )


def recorded_inputs(cfg: BenchConfig) -> schema.BenchInputs:
    """The model config and the workload by content, so that re-prediction needs no other file."""
    from tpplan.models.config import load_config_dict

    return schema.BenchInputs(config=load_config_dict(cfg.model)[0],
                              workload=load_workload(cfg.workload).model_dump(mode="json"))  # fmt: skip


def _overhead(raw: dict[str, Any] | None) -> schema.RuntimeOverhead | None:
    if not raw or raw["busy_s"] <= 0 or raw["pass_s"] <= 0:
        return None
    return schema.RuntimeOverhead(pass_s=raw["pass_s"], busy_s=raw["busy_s"], kernels=int(raw["kernels"]),
                                  by_kernel=[tuple(r) for r in raw.get("by_kernel", [])],
                                  clocks=raw.get("clocks"))  # fmt: skip


def _kernels_note(cfg: BenchConfig, raw: dict[str, Any]) -> str:
    """The implementations the run used, per kernel family (`OpResult.impl` has them per op)."""
    impls = raw.get("impls")
    if not impls:
        return "reference kernels (runtime.kernels) throughout" if cfg.kernels != "fast" else "fast kernels"
    return (
        f"attention: {impls['mla']}; routed experts: {impls['experts']}; KDA: {impls['kda']}; "
        f"GDN: {impls['gdn']}; norms: {impls['norm']}"
    )


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("tpplan")
    except Exception:  # optional metadata
        return None


# ----------------------------------------------------------------------------------------------
# Output: files, markdown, checks


def output_paths(out: Path, plans: Sequence[str]) -> dict[str, Path]:
    """One plan: `out` itself; several: `<stem>-<plan><suffix>` beside it (one schema file per plan)."""
    if len(plans) == 1:
        return {plans[0]: out}
    safe = {p: "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in p) for p in plans}
    return {p: out.with_name(f"{out.stem}-{safe[p]}{out.suffix or '.json'}") for p in plans}


def write_atomic(files: dict[Path, str]) -> None:
    """Write every file to a temp file beside it, then rename them all; on any error, none is left."""
    from tpplan.outputs import write_files

    write_files(files)


def results_json(res: BenchResults) -> str:
    """The file's text, validated by the report's parser before it is written."""
    data = json.loads(res.model_dump_json(exclude_none=True))
    parse_bench_results(data, "tpplan bench output")
    return json.dumps(data, indent=1) + "\n"


def from_files(paths: Sequence[Path]) -> list[PlanBench]:
    """Results files written earlier (`--from`), for the markdown and the checks without a rerun.

    Files that keep the runtime-replay times (`replay_s`) give the same overhead check as the run;
    older ones compare the in-plan times with `direct_s`."""
    from tpplan.bench_results import load_bench_results

    out = []
    for p in paths:
        r = load_bench_results(p, "from_files=")
        replay = {i: c.replay_s for i, c in enumerate(r.collectives) if c.replay_s}
        out.append(PlanBench(r.plan, r, replay, {}, [], [], "as recorded in the results files"))
    return out
