"""The arrival options of audit, search and report, and the `serving` JSON block they add per deployment.

`--arrival-rate R` (Poisson, seeded by `--seed`), `--trace FILE` (JSONL or CSV), `--requests N`
(how many; default the workload's), or neither: the workload's closed loop. Each deployment then
gets the engine's serving loop (`tpplan.simulate.serving`) over its own step prices: TTFT mean,
p50, p90, p99 and the rest (docs/audit-json.md, `serving`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpplan.mesh import Mesh

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.layout.plan import Plan
    from tpplan.models.graph import ModelGraph
    from tpplan.simulate.requests import Arrivals
    from tpplan.simulate.serving import Arrival

ArrivalRateOpt = Annotated[
    float | None,
    typer.Option("--arrival-rate", help="Requests per second, Poisson (the workload's prompts): TTFT percentiles"),
]
TraceOpt = Annotated[
    str | None,
    typer.Option("--trace", help="Request trace, .jsonl or .csv: arrival_s, prompt_tokens[, output_tokens, ...]"),
]
RequestsOpt = Annotated[int | None, typer.Option("--requests", help="Requests to simulate (default: the workload's)")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the Poisson arrivals")]
SpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help="Speculative decoding/MTP as METHOD:K:A[:DRAFT]: mtp or eagle, K draft tokens per step, A tokens "
        "a request gains per step (1 to K + 1), DRAFT the EAGLE checkpoint (a local config.json or folder is read to "
        "price it); e.g. mtp:3:2.4 (docs/cost-model.md)",
    ),
]


def arrival_of(rate: float | None, trace: str | None, requests: int | None, seed: int) -> Arrival:
    """The arrival process the options name (neither rate nor trace: the workload's closed loop); a seed
    without a rate would seed nothing, and is refused rather than ignored."""
    from tpplan.errors import TpplanError
    from tpplan.simulate.serving import Arrival

    if seed and rate is None:
        raise TpplanError(f"--seed {seed}", "it seeds the Poisson arrivals of --arrival-rate, which is not given",
                          "add --arrival-rate, or drop --seed")  # fmt: skip

    return Arrival(rate=rate, trace=trace, requests=requests, seed=seed)


SPEC_PARTS = {"spec_method": "METHOD", "spec_draft_tokens": "K", "spec_accepted": "A", "spec_draft": "DRAFT"}


def speculative_of(text: str | None, requests: bool) -> Speculative | None:
    """The speculative decoding `--spec METHOD:K:A[:DRAFT]` asks for (None: not given); it prices decode
    steps, so it needs `requests` (a workload, a trace or a rate)."""
    from tpplan.engines.speculative import Speculative
    from tpplan.errors import TpplanError

    if text is None:
        return None
    if not requests:
        raise TpplanError("--spec", "prices decode steps, which needs requests", "add --workload or --trace")
    parts = text.split(":", 3)
    try:
        method, k, a = parts[:3]
        return Speculative(int(k), float(a), method, draft_model=parts[3] if len(parts) > 3 else None)  # type: ignore[arg-type]
    except ValueError:
        raise TpplanError(
            f"--spec {text}", "is not METHOD:K:A[:DRAFT]", "e.g. mtp:3:2.4 or eagle:5:3.1:DRAFT"
        ) from None
    except TpplanError as err:
        part = SPEC_PARTS.get(err.where.split("=")[0], err.where)
        fix = err.fix.replace("give spec_draft=", "end it with :")
        raise TpplanError(f"--spec {text}", f"{part} {err.reason}", fix) from None


def asked(rate: float | None, trace: str | None, requests: int | None) -> bool:
    """Whether any arrival option was given (they need a topology, and a rate needs a workload)."""
    return rate is not None or trace is not None or requests is not None


def serving_arrivals(arrival: Arrival, workload: Workload | None, graph: ModelGraph) -> Arrivals | None:
    """The requests to simulate, or None when there is no arrival process (no workload, no trace)."""
    from tpplan.simulate.serving import arrivals_for

    if workload is None and arrival.trace is None and arrival.rate is None:
        if arrival.requests is not None:  # else ignored: nothing to take that many requests from
            from tpplan.errors import TpplanError

            raise TpplanError(f"--requests {arrival.requests}", "counts the requests of a workload or a trace, "
                              "and none is given", "add --workload or --trace, or drop --requests")  # fmt: skip
        return None
    return arrivals_for(arrival, workload, graph.spec.numerics.max_position_embeddings)


def chunk_tokens(workload: Workload | None, engine: str, topo: Topology) -> int:
    """The step budget: the workload's chunk size (the launch line sets it), else the engine's default on this GPU."""
    from tpplan.engines import scheduler_rules

    if workload is not None:
        return workload.chunk_size
    return scheduler_rules(engine).budget.default_tokens(topo.gpu.memory_GiB, topo.gpu.name)


def serving_block(
    graph: ModelGraph, plan: Plan, topo: Topology, arrivals: Arrivals, workload: Workload | None, *, tp: int,
    pp: int = 1, dtype: str = "bf16", expert_dtype: str | None = None, engine: str | None = None, cp: int = 1,
    cp_recurrence: str = "scan", cp_layers: str = "all", cp_kv: str = "engines", replicas: int = 1,
    router: str | None = None, per_request: bool = False, speculative: Speculative | None = None,
) -> dict[str, object]:  # fmt: skip
    """The `serving` JSON of one deployment, its step prices the prediction's own (the same predictor,
    from `cached_predictor`'s cache, as `predict_plan` made with these arguments)."""
    from tpplan.cost.predictor import cached_predictor
    from tpplan.simulate.serving import serving_summary

    p = cached_predictor(
        graph,
        plan,
        topo,
        Mesh(
            tp,
            pp=pp,
            replicas=replicas,
            cp=cp,
            cp_recurrence=cp_recurrence,
            cp_layers=cp_layers,
            cp_kv=cp_kv,
            router=router,
        ),
        dtype,
        expert_dtype,
        engine=engine,
    )
    chunk = chunk_tokens(workload, p.pipeline.engine, topo)
    return serving_summary(p, arrivals, chunk, topo.gpus_per_node, per_request=per_request, speculative=speculative)[1]


def _row_name(entry: dict[str, object]) -> str:
    """A row's deployment, after its rank where it has one (a search's rows: several share a deployment)."""
    name = str(entry.get("deployment") or entry.get("name"))
    return f"#{entry['rank']} {name}" if entry.get("rank") is not None else name


def print_serving(entries: list[dict[str, object]], label: str = "plan") -> None:
    """The serving loop's TTFT per deployment, one row each, and the arrival process it ran."""
    from rich.table import Table
    from rich.text import Text

    from tpplan.commands._console import console, print_wrapped, show
    from tpplan.report.rows import fig  # four significant digits: 8 columns of seconds-long TTFTs fit 100 columns
    from tpplan.simulate.overheads import cost_lines

    rows = [e for e in entries if e.get("serving")]
    if not rows:
        return
    first = rows[0]["serving"]
    assert isinstance(first, dict)
    t = Table(title=f"Serving loop ({first['engine']}): TTFT in ms, with the fixed costs' band for the mean")
    for col in (label, "mean", "band", "p50", "p90", "p99", "queueing", "idealised mean"):
        t.add_column(col, justify="left" if col == label else "right")
    for e in rows:
        s = e["serving"]
        assert isinstance(s, dict)
        tt, band = s["ttft"], s["ttft_band"]["mean_s"]
        ms = {k: fig(tt[k] * 1e3) for k in ("mean_s", "p50_s", "p90_s", "p99_s")}
        span = f"{fig(band[0] * 1e3)}-{fig(band[1] * 1e3)}"
        name = Text(_row_name(e))
        t.add_row(name, ms["mean_s"], span, ms["p50_s"], ms["p90_s"], ms["p99_s"], f"{tt['queue_share']:.0%}",
                  fig(s["idealised_mean_s"] * 1e3))  # fmt: skip
    out = console()
    show(out, t)
    seen = dict.fromkeys(str(c) for e in rows for c in e["serving"]["conditions"])  # type: ignore[index]
    costs = cost_lines()  # the fixed costs are priced (in the mean and its band), not left out
    left, fixed = [c for c in seen if c not in costs], [c for c in seen if c in costs]
    if left:
        print_wrapped(out, "Not modelled for this engine: " + "; ".join(left))
    if fixed:
        print_wrapped(out, "Fixed costs in the mean and its band: " + "; ".join(fixed))
    _print_decode(rows, label)


def _print_decode(rows: list[dict[str, object]], label: str) -> None:
    """The same requests with decode (`serving.decode`): TTFT beside TPOT, ITL p99 and output tokens/s."""
    from rich.table import Table
    from rich.text import Text

    from tpplan.commands._console import console, print_wrapped, show
    from tpplan.report.rows import fig, rate

    dec: list[tuple[dict[str, object], dict[str, Any]]] = []
    for e in rows:
        d = e["serving"].get("decode") if isinstance(e["serving"], dict) else None
        if isinstance(d, dict):
            dec.append((e, d))
    if not dec:
        return
    t = Table(title="With decode: TTFT, TPOT and ITL in ms, output tokens/s")
    for col in (label, "TTFT mean", "TTFT p99", "TPOT mean", "TPOT p99", "ITL p99", "tok/s/GPU", "tok/s/user"):
        t.add_column(col, justify="left" if col == label else "right")
    refused = []
    for e, d in dec:
        name = _row_name(e)
        if not d["admitted"]:
            refused.append(f"{name}: {d['reason']}")
            continue
        ms = [fig(d[k][q] * 1e3) for k, q in (("ttft_s", "mean"), ("ttft_s", "p99"), ("tpot_s", "mean"),
                                                   ("tpot_s", "p99"), ("itl_s", "p99"))]  # fmt: skip
        t.add_row(Text(name), *ms, rate(d["output_tok_s_per_gpu"]), rate(d["output_tok_s_per_user"]))
    out = console()
    if t.rows:
        show(out, t)
    for line in refused:
        print_wrapped(out, f"Not admitted: {line}")
    spec = dec[0][1]["settings"].get("speculative")
    if spec:
        print_wrapped(out, f"Speculative decoding ({spec['method']}): {spec['draft_tokens']} draft tokens, "
                      f"{spec['verify_tokens']} verified and {spec['accepted_per_step']:g} accepted per request per "
                      f"step; launch flags: {' '.join(spec['flags'])}")  # fmt: skip
    print_wrapped(out, "Decode leaves out: " + "; ".join(str(c) for c in dec[0][1].get("conditions", [])))


__all__ = [
    "ArrivalRateOpt",
    "RequestsOpt",
    "SeedOpt",
    "SpecOpt",
    "TraceOpt",
    "arrival_of",
    "asked",
    "print_serving",
    "serving_arrivals",
    "serving_block",
    "speculative_of",
]
