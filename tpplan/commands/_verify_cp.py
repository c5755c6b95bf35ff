"""`tpplan verify --cp N`: a context-parallel deployment (TP 1 x CP N) run for real on gloo.

Rank r holds its share of the prompt's tokens (`tpplan.layout.context_parallel`); the assembled
final hidden and logits are compared with the single-process model, and every rank's CP calls
(kind, op, value, bytes, in order) with the planner's `cp_calls`
(`tpplan.runtime.context_parallel.verify_cp`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tpplan.errors import TpplanError

TOLERANCE = 1e-4  # fp32: max |error| / max |reference| of the logits


def _calls(calls: list[Any]) -> list[tuple[object, ...]]:
    return [(c.layer, c.kind, c.op, c.value, c.nbytes) for c in calls]


def check_cp_args(cp: int, tp: int, plans: list[str], chunk: int | None, dtype: str, backend: str) -> None:
    """What a CP run supports, each refusal one line (exit 2)."""
    if tp != 1:
        raise TpplanError(f"--tp {tp} --cp {cp}", "the runtime executes CP groups of TP 1 only",
                          "pass --tp 1 (the planner prices TP x CP: tpplan audit --cp)")  # fmt: skip
    if any(p != "baseline" for p in plans):
        raise TpplanError(f"--plan {' '.join(plans)}", "at TP 1 every plan is the baseline", "pass --plan baseline")
    if chunk is not None:
        raise TpplanError("--chunk", "chunked prefill under CP is not executed", "drop --chunk")
    if dtype != "fp32" or backend not in ("auto", "gloo"):
        raise TpplanError(f"--dtype {dtype} --backend {backend}", "CP runs fp32 on gloo (CPU)",
                          "pass --dtype fp32 --backend gloo")  # fmt: skip


def run_cp(model: str, cp: int, tokens: int, seed: int, weights: Path | None, timeout: float,
           recurrence: str = "serial") -> dict[str, Any]:  # fmt: skip
    """Run and summarise: `passed`, the errors, the trace per rank against the prediction."""
    from tpplan.runtime.context_parallel import verify_cp

    (r,) = verify_cp([model], cp, tokens=tokens, seed=seed, weights={model: str(weights)} if weights else None,
                     timeout_s=timeout, recurrence=recurrence)  # fmt: skip
    matches = [_calls(t) == _calls(p) for t, p in zip(r["traced"], r["predicted"], strict=True)]
    by_kind = Counter((c.kind, c.nbytes) for calls in r["traced"] for c in calls)
    predicted = Counter((c.kind, c.nbytes) for calls in r["predicted"] for c in calls)
    return {
        "model": model,
        "cp": cp,
        "tokens": tokens,
        "split": r["split"],
        "recurrence": recurrence,
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
    console.print(f"{status}  {s['model']} CP{s['cp']} (TP 1), {s['tokens']} tokens, {s['split']} split")
    console.print(f"  logits max rel error vs the single-process model {s['max_rel_logits_error']:.3e} "
                  f"(tolerance {s['tolerance']:g}); final hidden max abs {s['max_abs_hidden_error']:.3e}")  # fmt: skip
    same = "all ranks" if all(s["trace_matches_per_rank"]) else "[red]differs[/]"
    console.print(f"  CP calls traced {s['traced_calls']} ({s['traced_bytes']:,.0f} B) vs predicted "
                  f"{s['predicted_calls']} ({s['predicted_bytes']:,.0f} B), all ranks; "
                  f"trace == prediction (kind, op, value, bytes, order): {same}")  # fmt: skip
