"""One line for a failed multi-process run (verify, run, bench, calibrate), with a hint when the OS
killed a rank: how much memory the run was predicted to need and a smaller setting to try.

The hint follows only `RankKilled` (a SIGKILL the run did not send); a rank that did not answer
(`RankSilent`) or failed with an error is named as what was observed, with no guess at memory."""

from __future__ import annotations

import os

from rich.markup import escape

from tpplan.commands._console import console


def machine_memory() -> float | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def verify_memory_hint(model: str, ranks: int, dtype: str, random_weights: bool, reference: bool = True) -> str:
    """What `verify`/`run` hold per rank, from the checkpoint's tensor shapes (no tensor is made),
    and a smaller setting to try.

    Random weights: every rank makes the whole model in fp32 and keeps its shard in `dtype`, so
    fewer ranks need less memory. With --weights, `verify`'s rank 0 also loads the whole model for
    its reference (`reference`); `run` reads only each rank's shard.
    """
    from math import prod

    from tpplan.commands._audit_tables import _fmt_bytes
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.weights import expected_params

    graph = build_model_graph(load_model(model))
    elements = float(sum(prod(shape) for shape in expected_params(graph, numerics_for(graph)).values()))
    full = elements * 4
    shards = elements * (2 if dtype == "bf16" else 4)  # all ranks' shards together
    whole = full * ranks if random_weights else full if reference else 0.0
    who = "every rank holds" if random_weights else "rank 0 holds" if reference else ""
    held = f"{who} the whole model ({_fmt_bytes(full)} in fp32) plus its shard" if who else "each rank holds its shard"
    text = f"predicted: {held} (~{_fmt_bytes(shards / ranks)}), ~{_fmt_bytes(whole + shards)} for {ranks} rank(s)"
    total = machine_memory()
    if total is not None:
        text += f" on this {_fmt_bytes(total)} machine"
    fits = int((total - shards) // full) if total is not None and random_weights else 0
    smaller = f"--tp {min(fits, ranks - 1)}" if 1 <= fits < ranks else "a smaller --tp" if random_weights else ""
    tries = [t for t in (smaller, "fewer --tokens", "a smaller model (a tiny-* preset or k3-slice)") if t]
    return text + ". Try " + ", ".join(tries[:-1]) + " or " + tries[-1]


def print_failure(what: str, exc: Exception, hint: str | None = None, tail: str = "") -> None:
    """`<what> failed: <reason><tail>` on stderr, as one line; for a killed rank, `hint` follows."""
    from tpplan.runtime.group import RankKilled

    text = f"{exc}"
    if isinstance(exc, RankKilled) and hint:
        text += f"; {hint}"
    text += tail
    console(stderr=True).print(f"[bold red]{what} failed:[/] {escape(text)}", soft_wrap=True, markup=True)
