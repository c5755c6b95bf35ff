"""Context parallelism checked against the one-process model on local gloo ranks: `verify_cp` (TP 1 x
CP N, or `--cp-layers mla` at TP = CP = N) and `verify_tp_cp` (TP x CP with each TP group's
`PlanRunner`): the assembled final hidden (and logits), every rank's traced CP calls against the
lowered program's CP steps (`lower.schedule.predict_cp_calls`), and (TP x CP) its TP calls against
`predict_schedule`: both read the one `lower(graph, plan, mesh, batch)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.runtime.context_parallel import CpRunner, TpCpHook, cp_groups
from tpplan.runtime.context_parallel_mla import MlaOnlyCpRunner
from tpplan.runtime.executor import numerics_for


def _tp_worker(rank: int, world: int, device: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """One rank of `verify_tp_cp`: a TP group's PlanRunner under CP, assembled and checked on rank 0."""
    from tpplan.lower.schedule import predict_cp_calls, predict_schedule
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan
    from tpplan.runtime.distributed import PlanRunner, full_value, make_comm
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.shard import DictSource
    from tpplan.runtime.weights import random_weights

    torch.set_num_threads(1)
    mesh: Mesh = payload["mesh"]
    tp, t = mesh.tp, payload["tokens"]
    graph = build_model_graph(load_model(payload["model"]))
    nu = numerics_for(graph)
    weights = random_weights(graph, nu, seed=payload["seed"])
    ids = torch.randint(0, graph.spec.vocab, (t,), generator=torch.Generator().manual_seed(payload["seed"] + 1))
    tp_group, cp_group = cp_groups(mesh, rank)
    hook = TpCpHook(graph, mesh, rank, cp_group, t, nu)
    plan = make_plan(payload["plan"], graph, tp)
    comm = make_comm(hook.tp_rank, tp, group=tp_group)
    runner = PlanRunner(graph, plan, tp, hook.tp_rank, DictSource(weights), comm=comm, numerics=nu,
                        context_parallel=hook)  # fmt: skip
    mine = hook.positions_of_rank()
    (held,) = runner.prefill(ids[torch.tensor(mine)])
    hidden = full_value(comm, held, 0, len(mine))
    tp_calls = [(c.kind, c.value, tuple(c.shape), c.bytes) for c in runner.tracer.calls]
    sched = predict_schedule(graph, plan, tp, len(mine), rank=hook.tp_rank)
    tp_pred = [(c.kind, c.value, tuple(c.shape), c.bytes) for ch in sched for c in ch.calls]
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, (mine, hidden, hook.calls, tp_calls == tp_pred))
    if rank != 0:
        return None
    full = torch.empty(t, hidden.shape[1])
    for mine_r, h, _, _ in parts:
        full[mine_r] = h
    ref = run_reference(graph, weights, ids, numerics=nu, return_hidden=True)
    return {
        "model": payload["model"],
        "max_rel_hidden": ((full - ref).abs().max() / ref.abs().max()).item(),
        "cp_traced": [p[2] for p in parts],
        "cp_predicted": [
            predict_cp_calls(graph, plan, mesh, t, cp_rank=r // tp, dtype="float32") for r in range(world)
        ],
        "tp_trace_matches": [p[3] for p in parts],
    }


def verify_tp_cp(model: str, mesh: Mesh, *, plan: str = "baseline", tokens: int = 16, seed: int = 0,
                 timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
    """Run `model` under `plan` on `mesh` (TP x CP, its recurrence) on tp x cp gloo ranks against the
    one-process model: the final hidden, every rank's CP calls against the lowered program's
    (`predict_cp_calls`), its TP calls against `predict_schedule` at its own token count."""
    from tpplan.runtime.group import GroupSpec, run_group

    payload = {"model": model, "mesh": mesh, "plan": plan, "tokens": tokens, "seed": seed}
    return run_group(_tp_worker, GroupSpec("gloo", mesh.tp * mesh.cp, timeout_s), payload)


def _worker(rank: int, world: int, device: Any, payload: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Every case of `verify_cp` on this rank."""
    torch.set_num_threads(1)
    return [_case(rank, world, device, case) for case in payload]


def _case(rank: int, world: int, device: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """One case on one rank: run, then gather every rank's rows and trace to rank 0 (untraced)."""
    from tpplan.lower.schedule import predict_cp_calls
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.weights import load_safetensors, random_weights

    graph = build_model_graph(load_model(payload["model"]))
    nu = numerics_for(graph)
    path = payload.get("weights")
    weights = load_safetensors(path, graph, nu) if path else random_weights(graph, nu, seed=payload["seed"])
    ids = torch.randint(0, graph.spec.vocab, (payload["tokens"],),
                        generator=torch.Generator().manual_seed(payload["seed"] + 1))  # fmt: skip
    mesh: Mesh = payload["mesh"]
    runner_class = MlaOnlyCpRunner if mesh.cp_layers == "mla" else CpRunner
    runner = runner_class(graph, mesh, rank, weights, numerics=nu, device=device)
    hidden, mine = runner.prefill(ids)
    logits = runner.logits(hidden)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, (mine, hidden, logits, runner.calls))
    if rank != 0:
        return None
    t = ids.numel()
    full_h = torch.empty(t, hidden.shape[1])
    full_l = torch.empty(t, logits.shape[1])
    for pos, h, lg, _ in parts:
        full_h[pos], full_l[pos] = h, lg
    ref_h = run_reference(graph, weights, ids, numerics=nu, return_hidden=True)
    ref_l = run_reference(graph, weights, ids, numerics=nu)
    plan = make_plan("baseline", graph, mesh.tp)  # TP 1, or (`mla`) the other layers at TP 1 on every rank
    predicted = [predict_cp_calls(graph, plan, mesh, t, cp_rank=r) for r in range(world)]  # fp32, as it ran
    return {
        "model": payload["model"],
        "ids": ids,
        "hidden": full_h,
        "logits": full_l,
        "max_abs_hidden": (full_h - ref_h).abs().max().item(),
        "max_rel_logits": ((full_l - ref_l).abs().max() / ref_l.abs().max()).item(),
        "traced": [p[3] for p in parts],
        "predicted": predicted,
        "split": runner.split,
    }


def verify_cp(models: list[str], meshes: Mesh | Sequence[Mesh], *, tokens: int = 16, seed: int = 0,
              weights: dict[str, str] | None = None, timeout_s: float = 120.0) -> list[dict[str, Any]]:  # fmt: skip
    """Run each of `models` on each of `meshes` (TP 1 x CP N, or `cp_layers="mla"` at TP = CP = N, one CP
    size N for all: one group of N local gloo ranks) and compare with the one-process reference: the
    assembled final hidden and logits, and every rank's traced CP calls against the lowered program's
    (`predict_cp_calls`). `weights`: per model, a safetensors folder instead of random weights.
    One case per model and mesh (e.g. the two recurrences), in that order, in one process group."""
    from tpplan.runtime.group import GroupSpec, run_group

    ways = (meshes,) if isinstance(meshes, Mesh) else tuple(meshes)
    if len({m.cp for m in ways}) != 1:
        raise TpplanError(", ".join(m.fields() for m in ways), "one process group runs one CP size",
                          "verify each CP size on its own")  # fmt: skip
    payload = [{"model": m, "tokens": tokens, "seed": seed, "weights": (weights or {}).get(m), "mesh": mesh}
               for m in models for mesh in ways]  # fmt: skip
    return run_group(_worker, GroupSpec("gloo", ways[0].cp, timeout_s), payload)


__all__ = ["verify_cp", "verify_tp_cp"]
