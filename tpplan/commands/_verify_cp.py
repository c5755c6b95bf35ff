"""`tpplan verify --cp N`: a context-parallel deployment (TP 1 x CP N, or TP x CP) run for real on gloo.

Rank r holds its share of the prompt's tokens (`tpplan.layout.context_parallel`); the assembled
final hidden and logits are compared with the single-process model, and every rank's CP calls
(kind, op, value, bytes, in order) with the lowered program's CP steps (`lower.schedule.predict_cp_calls`;
`tpplan.runtime.context_parallel_verify.verify_cp`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.markup import escape

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

TOLERANCE = 1e-4  # fp32: max |error| / max |reference| of the logits


def _calls(calls: list[Any]) -> list[tuple[object, ...]]:
    return [(c.layer, c.kind, c.op, c.value, c.nbytes) for c in calls]


def check_cp_args(cp: int, tp: int, plans: list[str], chunk: int | None, dtype: str, backend: str,
                  layers: str = "all") -> None:  # fmt: skip
    """What a CP run supports, each refusal one line (exit 2)."""
    if layers == "mla" and tp != cp:
        raise TpplanError(f"--tp {tp} --cp {cp} --cp-layers mla", "an MLA-only CP run executes TP = CP "
                          "(attention TP 1, the CP group inside the TP group)",
                          f"pass --tp {cp} --cp {cp}")  # fmt: skip
    if layers == "mla" and plans != ["baseline"]:
        raise TpplanError(f"--plan {' '.join(plans)}", "an MLA-only CP run executes the baseline (its other layers "
                          "at TP 1 on every rank)", "pass --plan baseline")  # fmt: skip
    if len(plans) != 1 or (tp == 1 and plans[0] != "baseline"):
        raise TpplanError(f"--plan {' '.join(plans)}", "a CP run verifies one plan (at TP 1 only the baseline)",
                          "pass one --plan (baseline at --tp 1)")  # fmt: skip
    if chunk is not None:
        raise TpplanError("--chunk", "chunked prefill under CP is not executed", "drop --chunk")
    if dtype != "fp32" or backend not in ("auto", "gloo"):
        raise TpplanError(f"--dtype {dtype} --backend {backend}", "CP runs fp32 on gloo (CPU)",
                          "pass --dtype fp32 --backend gloo")  # fmt: skip


def run_tp_cp(model: str, plan: str, tp: int, cp: int, tokens: int, seed: int, timeout: float,
              recurrence: str = "serial") -> dict[str, Any]:  # fmt: skip
    """TP `tp` x CP `cp` (random weights): the final hidden, CP calls per rank against the lowered program's,
    TP calls against `predict_schedule`."""
    from tpplan.runtime.context_parallel_verify import verify_tp_cp

    mesh = Mesh(tp, cp=cp, cp_recurrence=recurrence)
    r = verify_tp_cp(model, mesh, plan=plan, tokens=tokens, seed=seed, timeout_s=timeout)
    matches = [_calls(t) == _calls(p) for t, p in zip(r["cp_traced"], r["cp_predicted"], strict=True)]
    return {
        "model": model, "plan": plan, "tp": tp, "cp": cp, "tokens": tokens, "recurrence": recurrence,
        "max_rel_hidden_error": r["max_rel_hidden"], "tolerance": TOLERANCE,
        "trace_matches_per_rank": matches, "tp_trace_matches_per_rank": r["tp_trace_matches"],
        "traced_calls": sum(len(t) for t in r["cp_traced"]), "predicted_calls": sum(len(p) for p in r["cp_predicted"]),
        "passed": r["max_rel_hidden"] <= TOLERANCE and all(matches) and all(r["tp_trace_matches"]),
    }  # fmt: skip


def run_cp(model: str, cp: int, tokens: int, seed: int, weights: Path | None, timeout: float,
           recurrence: str = "serial", layers: str = "all") -> dict[str, Any]:  # fmt: skip
    """Run and summarise: `passed`, the errors, the trace per rank against the prediction."""
    from tpplan.runtime.context_parallel_verify import verify_cp

    mesh = Mesh(cp if layers == "mla" else 1, cp=cp, cp_recurrence=recurrence, cp_layers=layers)
    (r,) = verify_cp([model], mesh, tokens=tokens, seed=seed, weights={model: str(weights)} if weights else None,
                     timeout_s=timeout)  # fmt: skip
    matches = [_calls(t) == _calls(p) for t, p in zip(r["traced"], r["predicted"], strict=True)]
    by_kind = Counter((c.kind, c.nbytes) for calls in r["traced"] for c in calls)
    predicted = Counter((c.kind, c.nbytes) for calls in r["predicted"] for c in calls)
    return {
        "model": model,
        "cp": cp,
        "tokens": tokens,
        "split": r["split"],
        "recurrence": recurrence,
        "layers": layers,
        "max_abs_hidden_error": r["max_abs_hidden"],
        "max_rel_logits_error": r["max_rel_logits"],
        "tolerance": TOLERANCE,
        "trace_matches_per_rank": matches,
        "traced_calls": sum(by_kind.values()),
        "traced_bytes": sum(k[1] * n for k, n in by_kind.items()),
        "predicted_calls": sum(predicted.values()),
        "predicted_bytes": sum(k[1] * n for k, n in predicted.items()),
        "passed": r["max_rel_logits"] <= TOLERANCE and all(matches),
    }


def print_cp(console: Any, s: dict[str, Any]) -> None:
    status = "[bold green]PASS[/]" if s["passed"] else "[bold red]FAIL[/]"
    if "tp" in s:  # TP x CP
        cp_ok = "all ranks" if all(s["trace_matches_per_rank"]) else "[red]differs[/]"
        tp_ok = "all ranks" if all(s["tp_trace_matches_per_rank"]) else "[red]differs[/]"
        head = f"{escape(s['model'])} {escape(s['plan'])} TP{s['tp']} x CP{s['cp']}, {s['tokens']} tokens"
        console.print(f"{status}  {head}", markup=True)
        console.print(f"  final hidden max rel error vs the single-process model {s['max_rel_hidden_error']:.3e} "
                      f"(tolerance {s['tolerance']:g}); CP calls {s['traced_calls']} traced, "
                      f"{s['predicted_calls']} predicted, equal: {cp_ok}; "
                      f"TP calls == predict_schedule: {tp_ok}", markup=True)  # fmt: skip
        return
    shape = f"CP{s['cp']} inside TP{s['cp']}, MLA layers only" if s.get("layers") == "mla" else f"CP{s['cp']} (TP 1)"
    console.print(f"{status}  {escape(s['model'])} {shape}, {s['tokens']} tokens, {s['split']} split", markup=True)
    console.print(f"  logits max rel error vs the single-process model {s['max_rel_logits_error']:.3e} "
                  f"(tolerance {s['tolerance']:g}); final hidden max abs {s['max_abs_hidden_error']:.3e}")  # fmt: skip
    same = "all ranks" if all(s["trace_matches_per_rank"]) else "[red]differs[/]"
    console.print(f"  CP calls traced {s['traced_calls']} ({s['traced_bytes']:,.0f} B) vs predicted "
                  f"{s['predicted_calls']} ({s['predicted_bytes']:,.0f} B), all ranks; "
                  f"trace == prediction (kind, op, value, bytes, order): {same}", markup=True)  # fmt: skip
