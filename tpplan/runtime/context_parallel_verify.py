"""Context parallelism checked against the one-process model on local gloo ranks: `verify_cp` (TP 1 x
CP N, or `--cp-layers mla` at TP = CP = N) and `verify_tp_cp` (TP x CP with each TP group's
`PlanRunner`): the assembled final hidden (and logits), every rank's traced CP calls against the
planner's `layout.context_parallel.cp_calls`, and (TP x CP) its TP calls against `predict_schedule`."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tpplan.runtime.context_parallel import CpRunner, TpCpHook, cp_groups
from tpplan.runtime.context_parallel_mla import MlaOnlyCpRunner
from tpplan.runtime.executor import numerics_for


def _tp_worker(rank: int, world: int, device: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """One rank of `verify_tp_cp`: a TP group's PlanRunner under CP, assembled and checked on rank 0."""
    from tpplan.layout.context_parallel import cp_calls
    from tpplan.lower.schedule import predict_schedule
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan
    from tpplan.runtime.distributed import PlanRunner, full_value, make_comm
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.shard import DictSource
    from tpplan.runtime.weights import random_weights

    torch.set_num_threads(1)
    tp, cp, t = payload["tp"], world // payload["tp"], payload["tokens"]
    graph = build_model_graph(load_model(payload["model"]))
    nu = numerics_for(graph)
    weights = random_weights(graph, nu, seed=payload["seed"])
    ids = torch.randint(0, graph.spec.vocab, (t,), generator=torch.Generator().manual_seed(payload["seed"] + 1))
    tp_group, cp_group = cp_groups(tp, cp, rank)
    hook = TpCpHook(graph, tp, cp, rank, cp_group, t, nu, payload["recurrence"])
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
    b = torch.empty((), dtype=torch.float32).element_size()
    return {
        "model": payload["model"],
        "max_rel_hidden": ((full - ref).abs().max() / ref.abs().max()).item(),
        "cp_traced": [p[2] for p in parts],
        "cp_predicted": [cp_calls(graph, hook.audit, t, b, r // tp) for r in range(world)],
        "tp_trace_matches": [p[3] for p in parts],
    }


def verify_tp_cp(model: str, tp: int, cp: int, *, plan: str = "baseline", tokens: int = 16, seed: int = 0,
                 recurrence: str = "serial", timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
    """Run `model` under `plan` at TP `tp` x CP `cp` on tp x cp gloo ranks against the one-process
    model: the final hidden, every rank's CP calls against `cp_calls`, its TP calls against
    `predict_schedule` at its own token count."""
    from tpplan.runtime.group import GroupSpec, run_group

    payload = {"model": model, "tp": tp, "plan": plan, "tokens": tokens, "seed": seed, "recurrence": recurrence}
    return run_group(_tp_worker, GroupSpec("gloo", tp * cp, timeout_s), payload)


def _worker(rank: int, world: int, device: Any, payload: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Every case of `verify_cp` on this rank."""
    torch.set_num_threads(1)
    return [_case(rank, world, device, case) for case in payload]


def _case(rank: int, world: int, device: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """One case on one rank: run, then gather every rank's rows and trace to rank 0 (untraced)."""
    from tpplan.layout.context_parallel import cp_calls
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.weights import load_safetensors, random_weights

    graph = build_model_graph(load_model(payload["model"]))
    nu = numerics_for(graph)
    path = payload.get("weights")
    weights = load_safetensors(path, graph, nu) if path else random_weights(graph, nu, seed=payload["seed"])
    ids = torch.randint(0, graph.spec.vocab, (payload["tokens"],),
                        generator=torch.Generator().manual_seed(payload["seed"] + 1))  # fmt: skip
    layers = payload.get("layers", "all")
    runner_class = MlaOnlyCpRunner if layers == "mla" else CpRunner
    runner = runner_class(graph, world, rank, weights, numerics=nu, device=device, recurrence=payload["recurrence"],
                          layers=layers)  # fmt: skip
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
    b = torch.empty((), dtype=torch.float32).element_size()
    predicted = [cp_calls(graph, runner.audit, t, b, r) for r in range(world)]
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


def verify_cp(models: list[str], cp: int, *, tokens: int = 16, seed: int = 0, weights: dict[str, str] | None = None,
              timeout_s: float = 120.0, recurrence: str | tuple[str, ...] = "serial",
              layers: str = "all") -> list[dict[str, Any]]:  # fmt: skip
    """Run each of `models` at CP `cp` on `cp` local gloo ranks (one group for all) and compare with
    the one-process reference: the assembled final hidden and logits, and every rank's traced CP
    calls against `cp_calls`. `weights`: per model, a safetensors folder instead of random weights.
    `layers="mla"`: only the MLA attention token-sharded, TP = CP = `cp` (`context_parallel_mla`).
    Several `recurrence`s: one case per model and recurrence, in that order, in one process group."""
    from tpplan.runtime.group import GroupSpec, run_group

    ways = (recurrence,) if isinstance(recurrence, str) else recurrence
    payload = [{"model": m, "tokens": tokens, "seed": seed, "weights": (weights or {}).get(m), "recurrence": rec,
                "layers": layers} for m in models for rec in ways]  # fmt: skip
    return run_group(_worker, GroupSpec("gloo", cp, timeout_s), payload)


__all__ = ["verify_cp", "verify_tp_cp"]
