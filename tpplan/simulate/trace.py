"""A request trace file: one request per line, read through `tpplan.inputs` and checked row by row.

Formats: JSON Lines (`.jsonl`, one object per line) or CSV (`.csv`, a header line). Fields:
`arrival_s` (seconds from the trace's start, sorted, at most MAX_TRACE_S), `prompt_tokens`,
`output_tokens` (default 1), and optionally `prefix_id` with `prefix_tokens`: requests of one
prefix id share their first `prefix_tokens` tokens, which the first of them (in trace order)
computes and every later one finds in the prefix cache (no eviction is modelled). Bad input is one
TpplanError naming the file, the line and the field (exit 2 at the CLI).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpplan.cost._files import validate
from tpplan.cost.workload import MAX_REQUESTS, MAX_TOKENS
from tpplan.errors import TpplanError
from tpplan.inputs import read_text
from tpplan.simulate.requests import Request, Timed

MAX_TRACE_S = 30 * 86400.0  # a month: a later arrival is a unit mistake (ms for s), not a workload
FIX = "pass a .jsonl or .csv trace: arrival_s, prompt_tokens[, output_tokens, prefix_id, prefix_tokens] per line"


class TraceRow(BaseModel):
    """One line of a trace (CSV cells arrive as text and are converted)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    arrival_s: float = Field(ge=0, le=MAX_TRACE_S)
    prompt_tokens: int = Field(ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    prefix_id: str | None = Field(default=None, max_length=200)
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _prefix_inside_prompt(self) -> TraceRow:
        if self.prefix_tokens > self.prompt_tokens:
            raise ValueError(f"prefix_tokens {self.prefix_tokens} exceed prompt_tokens {self.prompt_tokens}")
        if self.prefix_tokens and self.prefix_id is None:
            raise ValueError("prefix_tokens needs a prefix_id")
        return self


def _rows(text: str, path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, raw fields) per request line."""
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        out = []
        for row in reader:
            if None in row or None in row.values():
                raise TpplanError(f"{path} line {reader.line_num}", "has a different number of cells than the header",
                                  FIX)  # fmt: skip
            out.append((reader.line_num, {k: (v if v != "" else None) for k, v in row.items() if v != ""}))
        return out
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=lambda c: math.nan)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise TpplanError(f"{path} line {n}", f"is not JSON ({str(exc)[:80]})", FIX) from None
        if not isinstance(obj, dict):
            raise TpplanError(f"{path} line {n}", f"is a {type(obj).__name__}, not an object", FIX)
        out.append((n, obj))
    return out


def load_trace(path: str | Path, max_context: int | None = None) -> Timed:
    """The requests of a trace file, in order; `max_context`: the model's context, which no prompt may exceed."""
    p = Path(path)
    if p.suffix.lower() not in (".jsonl", ".csv"):
        raise TpplanError(f"trace {p}", "has neither a .jsonl nor a .csv name", FIX)
    rows = _rows(read_text(p, f"trace {p}", FIX), p)
    if not rows:
        raise TpplanError(f"trace {p}", "holds no request", FIX)
    if len(rows) > MAX_REQUESTS:
        raise TpplanError(f"trace {p}", f"holds {len(rows)} requests, more than {MAX_REQUESTS}", "split the trace")
    requests: list[Request] = []
    seen: set[str] = set()
    for i, (n, raw) in enumerate(rows):
        row = validate(TraceRow, raw, f"trace {p} line {n}")
        if requests and row.arrival_s < requests[-1].arrival_s:
            raise TpplanError(f"trace {p} line {n}", f"arrival_s {row.arrival_s} is before the line above's "
                              f"{requests[-1].arrival_s}", "sort the trace by arrival time")  # fmt: skip
        if max_context is not None and row.prompt_tokens > max_context:
            why = f"prompt_tokens {row.prompt_tokens} exceed the model's context of {max_context} tokens"
            raise TpplanError(f"trace {p} line {n}", why, "shorten the prompt or use a model with a longer context")
        if max_context is not None and row.prompt_tokens + row.output_tokens - 1 > max_context:
            why = (f"prompt_tokens {row.prompt_tokens} + output_tokens {row.output_tokens} run past the model's "
                   f"context of {max_context} tokens")  # fmt: skip
            raise TpplanError(f"trace {p} line {n}", why, "shorten the output or the prompt")
        cached = row.prefix_tokens if row.prefix_id in seen else 0
        if row.prefix_id is not None:
            seen.add(row.prefix_id)
        requests.append(Request(i, row.arrival_s, row.prompt_tokens, row.output_tokens,
                                min(cached, row.prompt_tokens - 1), row.prefix_id))  # fmt: skip
    return Timed(tuple(requests))


__all__ = ["MAX_TRACE_S", "TraceRow", "load_trace"]
