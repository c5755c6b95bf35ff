"""Ranges of the integer options that size the work (--tp, --pp, --cp, --replicas, --nodes, --tokens), checked as
typer parses them, so `--tokens 10**12` or `--nodes 10**23` is one line and exit 2 at once instead
of minutes of work or a traceback. The option keeps its own help and default; this adds the range."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from tpplan.errors import TpplanError

MAX_TP = 4096  # ranks of one TP group: beyond any cluster tpplan prices
MAX_PP = 1024
MAX_CP = 64  # context-parallel groups per stage (tpplan.layout.context_parallel.MAX_CP)
MAX_REPLICAS = 4096  # copies of a deployment (each needs a client of the workload: at most its concurrency)
MAX_NODES = 4096
MAX_TOKENS = 2**24  # as the workload's prompt length (tpplan.cost.workload.MAX_TOKENS)


def bounded(option: str, low: int, high: int) -> Callable[[int | None], int | None]:
    """A typer callback refusing values of `option` outside [low, high] (None: not given, passes)."""

    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise TpplanError(
                f"{option} {value}", f"must be at least {low} and at most {high}", f"pass {option} in that range"
            )
        return value

    return check


TP_RANGE = bounded("--tp", 1, MAX_TP)
PP_RANGE = bounded("--pp", 1, MAX_PP)
CP_RANGE = bounded("--cp", 1, MAX_CP)
REPLICAS_RANGE = bounded("--replicas", 1, MAX_REPLICAS)
NODES_RANGE = bounded("--nodes", 1, MAX_NODES)


def named(option: str) -> Callable[[Any], Any]:
    """A typer callback refusing an empty value of `option` (`--topology ""`), which the commands would
    otherwise read as "not given" and run without it; for a repeatable option, any empty value."""

    def check(value: Any) -> Any:
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            raise TpplanError(
                f'{option} ""', "is empty", f"give {option} a value (a preset or a file), or leave it out"
            )
        return value

    return check


def replica_count(value: str | None) -> int | Literal["all"] | None:
    """`search --replicas`: a count in [1, MAX_REPLICAS], or "all" (every count that divides the GPUs)."""
    if value is None:
        return None
    if value == "all":
        return "all"
    try:
        count = int(value)
    except ValueError:
        raise TpplanError(
            f"--replicas {value}", "is neither a count nor 'all'", "pass e.g. --replicas 2 or --replicas all"
        ) from None
    return REPLICAS_RANGE(count)


TOKENS_RANGE = bounded("--tokens", 1, MAX_TOKENS)
