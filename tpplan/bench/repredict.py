"""`tpplan bench --from RESULTS.json --repredict`: price a recorded run again with the current cost model.

Why: the measurements of a run stay true while the cost model changes; re-pricing them shows at once
whether a change to the model made its predictions better or worse where they were measured (a test
re-predicts the shipped runs, docs/benchmarks/, so a change that breaks accuracy fails CI).

The run is rebuilt from what its file recorded, never from the current folder: the model config and
the workload by content (`inputs`, files since schema version 2); in older files, the model, workload
and topology names, a relative path among them read beside the results file first (where the run's
files were kept with it), then as given. Then the model slice (`--layers` from the recorded
command, the experts kept; its layer kinds must match), the workload with the command's
`--tokens/--chunk/--requests`, the TP size and dtype, and each op's implementation (`OpResult.impl`;
a physical kernel model prices an op only if it ran the kernel the model was fitted on, so files
from before `impl` existed keep the roofline and the profiles). Every op, layer, batch and
collective then gets the prediction `tpplan bench` would have written, as a mean over the same
batch segments; measurements, meta and replay times are kept as recorded.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpplan.bench.config import BenchConfig, kernel_impls, resolved_workload
from tpplan.bench.model_slice import build_slice
from tpplan.bench.results import PlanBench
from tpplan.bench_results import BenchResults, OpResult, load_bench_results
from tpplan.cost.workload import Workload
from tpplan.errors import TpplanError, validated
from tpplan.mesh import Mesh
from tpplan.models.spec import ModelSpec

# Options of the recorded command that shape the slice, the workload and the TTFT target.
_OPTS = {"--layers": "layers", "--tokens": "tokens", "--chunk": "chunk", "--requests": "requests",
         "--dtype": "dtype", "--target-topology": "target_topology", "--target-nodes": "target_nodes"}  # fmt: skip
_INTS = {"tokens", "chunk", "requests", "target_nodes"}


def recorded_config(r: BenchResults, topology: str) -> BenchConfig:
    """The run's `BenchConfig` as far as the results file and its recorded command say."""
    try:
        argv = shlex.split(r.meta.command)
    except ValueError:
        argv = []
    found: dict[str, Any] = {}
    for i, a in enumerate(argv[:-1]):
        key = _OPTS.get(a)
        if key is not None:
            found[key] = int(argv[i + 1]) if key in _INTS else argv[i + 1]
    for a in argv:
        opt, eq, val = a.partition("=")
        if eq and opt in _OPTS:
            found[_OPTS[opt]] = int(val) if _OPTS[opt] in _INTS else val
    return BenchConfig(model=r.model, plans=(r.plan,), workload=r.workload or "seed-c8", topology=topology,
                       experts=r.model_slice.experts, nproc=r.tp, command=r.meta.command, progress=False,
                       **found)  # fmt: skip


def repredict_one(path: Path, topology: str | None) -> PlanBench:
    """One results file re-priced (see the module docstring)."""
    from tpplan.bench.ttft import extrapolate_ttft
    from tpplan.cost.collectives import collective_time
    from tpplan.cost.predict import Predictor
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import schedule
    from tpplan.plans.named import make_plan

    r = load_bench_results(path, "from_files=")
    topo_name = topology or (_beside(path, r.topology) if r.topology else None)
    if topo_name is None:
        raise TpplanError(f"from_files={path}", "records no topology", "pass topology= to re-predict it")
    cfg = recorded_config(r, topo_name)
    if cfg.target_topology:
        cfg = dataclasses.replace(cfg, target_topology=_beside(path, cfg.target_topology))
    spec, base = _recorded_inputs(path, r)
    if spec is None:
        cfg = dataclasses.replace(cfg, model=_beside(path, cfg.model), workload=_beside(path, cfg.workload))
    sl = build_slice(cfg.model, cfg.layers, cfg.experts, spec=spec)
    g = sl.graph
    if g.counts() != r.model_slice.layer_kinds:
        raise TpplanError(f"from_files={path}", f"the recorded slice {r.model_slice.layer_kinds} is not the one "
                          f"rebuilt from its command ({g.counts()})", "re-run the bench")  # fmt: skip
    topo = load_topology(topo_name)
    wl = resolved_workload(cfg, base)
    dtype = cfg.dtype or ("bf16" if r.meta.nccl_version else "fp32")
    impls = kernel_impls(g, ((o.layer_kind, o.op, o.impl) for o in r.ops))  # empty for older files
    plan = make_plan(r.plan, g, r.tp)
    p = Predictor(g, plan, topo, Mesh(r.tp), dtype, None, impls=impls)  # not cached: this run's kernels
    op_pred: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
    layer_pred: dict[tuple[str, int], list[float]] = defaultdict(list)
    batch_pred: dict[int, float] = {}
    for b in schedule(wl):
        batch_pred[b.index] = p.latency(tuple((s.n_tokens, s.start_pos) for s in b.segments))
        for s in b.segments:
            for res in p.audit.layer_results:  # every layer of the slice, as the run timed each
                kt = p.kind_time(res, ((s.n_tokens, s.start_pos),))
                layer_pred[(res.kind, s.n_tokens)].append(kt.total_s)
                for o in kt.ops:
                    op_pred[(res.kind, o.op, s.n_tokens)].append(o)
    ops = [_repriced(o, op_pred.get((o.layer_kind, o.op, o.tokens))) for o in r.ops]
    layers = [x.model_copy(update={"predicted_s": statistics.fmean(layer_pred[(x.layer_kind, x.tokens)])})
              if layer_pred.get((x.layer_kind, x.tokens)) else x for x in r.layers]  # fmt: skip
    batches = [x.model_copy(update={"predicted_s": batch_pred.get(x.index, x.predicted_s)}) for x in r.batches]
    rpn = min(r.tp, topo.gpus_per_node)
    colls = []
    for c in r.collectives:
        est = collective_time(c.kind, float(c.bytes), c.group_size, topo, ranks_per_node=rpn)
        colls.append(c.model_copy(update={"predicted_s": est.time_s, "algorithm": est.algorithm}))
    ttft = [extrapolate_ttft(cfg, wl, sl, r.plan, ops, colls)] if cfg.target_topology else []
    new = r.model_copy(update={"topology": topo_name, "ops": ops, "layers": layers, "batches": batches,
                               "collectives": colls, "ttft": ttft})  # fmt: skip
    replay = {i: c.replay_s for i, c in enumerate(new.collectives) if c.replay_s}
    contexts = {b.index: ",".join(str(s.start_pos) for s in b.segments) for b in schedule(wl)}
    note = "; ".join(f"{k}: {v}" for k, v in sorted(impls.items())) or "as recorded (no implementations recorded)"
    return PlanBench(r.plan, new, replay, contexts, [], [], f"re-predicted on `{topo_name}`; ran {note}")


def _repriced(o: OpResult, got: list[Any] | None) -> OpResult:
    """A recorded op row with the new predictions (`got`: this op's priced ops; None: priced nowhere)."""
    if not got:
        return o.model_copy(update={"predicted_s": None, "modelled_s": None, "source": None, "band": None})
    pred = statistics.fmean(x.seconds for x in got)
    modelled = statistics.fmean(x.modelled_s or 0.0 for x in got)
    return o.model_copy(update={"predicted_s": pred if pred > 0 else None,
                                "modelled_s": modelled if modelled > 0 else None, "source": got[0].source,
                                "band": got[0].band})  # fmt: skip


def _beside(results: Path, name: str) -> str:
    """A recorded relative path as it lies beside the results file, when it does; else as recorded
    (a preset name, an absolute path, or a path from the current folder)."""
    if Path(name).is_absolute():
        return name
    there = results.parent / name
    return str(there) if there.is_file() else name


def _recorded_inputs(path: Path, r: BenchResults) -> tuple[ModelSpec | None, Workload | None]:
    """The model spec and the workload from the file's `inputs` (None, None for older files)."""
    if r.inputs is None:
        return None, None
    from tpplan.models.config import list_presets, spec_from_config

    raw = r.inputs.config
    name = r.model if r.model in list_presets() else str(raw.get("_name_or_path") or Path(r.model).stem)
    spec = spec_from_config(raw, label=f"--from {path}: inputs.config", name=name)
    wl = validated(
        Workload, r.inputs.workload, f"from_files={path}: inputs.workload", "regenerate it with `tpplan bench`"
    )
    return spec, wl


def repredict(paths: Sequence[Path], topology: str | None) -> list[PlanBench]:
    """Every file re-priced, in order."""
    return [repredict_one(Path(p), topology) for p in paths]


__all__ = ["recorded_config", "repredict", "repredict_one"]
