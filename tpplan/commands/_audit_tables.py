"""The audit's printed tables (`tpplan audit` without `--json`): bytes per token per plan and layer kind,
predicted times and memory, context parallelism and crossovers; and the lines under predicted tables
that `tpplan search` prints too (the band, an over-memory plan, the fp8 fallback)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpplan.commands._console import console as make_console
from tpplan.commands._console import print_wrapped, show, styled
from tpplan.placement import COLLECTIVE_SHORT
from tpplan.units import signed_pct

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.models.graph import ModelGraph


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:,.1f} {unit}" if unit != "B" else f"{b:,.0f} B"
        b /= 1024
    return f"{b:,.1f} GiB"


TP1_NOTE = (
    "  TP1: one GPU holds every head and every token, so no TP collective runs, no plan moves a byte and each "
    "computes as baseline does; `legal`, the collectives and the reasons below are what each plan's decisions do "
    "at TP2 and above."
)


def print_audit(data: dict, wide: bool = False) -> None:
    """The audit without a topology: the model, then per plan its bytes per token per rank over the whole
    model and per layer kind, and each plan's root illegal edges and engine gates."""
    console = make_console(wide=wide)
    console.print(
        f"[bold]{escape(data['model'])}[/] ({data['model_type']}, hidden {data['hidden']}, {data['layers']} layers: "
        + ", ".join(f"{k} x{c}" for k, c in data["layer_kind_counts"].items())
        + f") at TP{data['tp']}, {data['dtype']}",
        markup=True,
    )
    for note in data.get("not_modelled", ()):
        console.print(f"  not modelled: {note}", markup=False)
    for note in data.get("defaulted", ()):
        console.print(f"  defaulted: {note}", markup=False)
    if data["tp"] == 1:  # the plans' decisions are about TP ranks: with one, none of them moves data
        print_wrapped(console, TP1_NOTE, indent=2)
    t = Table(title="Whole model: communication per token per rank (ring, (N-1)/N included)")
    for col in (
        "plan",
        "legal",
        "bytes/tok/rank",
        "vs base",
        "rel. units",
        "collectives per forward",
        "replicated/rank",
    ):
        t.add_column(col, justify="right" if col not in ("plan", "legal") else "left")
    for p in data["plans"]:
        counts = " ".join(f"{COLLECTIVE_SHORT[k]}x{v}" for k, v in sorted(p["collectives_per_forward"].items()))
        t.add_row(
            p["name"],
            styled("yes" if p["legal"] else "[red]NO[/]"),
            f"{p['comm_bytes_per_token_per_rank']:,.0f}",
            signed_pct(p["comm_delta_pct"]),
            f"{p['comm_units_per_token']:,.0f}",
            counts,
            _fmt_bytes(p["replicated_extra_bytes_per_rank"]),
        )
    show(console, t)
    show(console, _per_kind_table(data["plans"]))
    _print_reasons(console, data["plans"])


def _per_kind_table(plans: list[dict]) -> Table:
    """Per plan and layer kind: legality, the attention input's units against baseline, the collectives."""
    k = Table(title="Per layer kind (relative units: AR=2W, RS=AG=W, A2A=W/N)")
    for col in ("plan", "layer kind", "legal", "attn-in units", "vs base", "layer units", "collectives per layer"):
        k.add_column(col)
    for p in plans:
        for kind, info in p["layer_kinds"].items():
            colls = " + ".join(
                f"{COLLECTIVE_SHORT[c['collective']]}({c['value'].split(':')[0]} {c['width']})"
                for c in info["collectives"]
            )
            k.add_row(
                p["name"],
                f"{kind} x{info['count']}",
                styled("yes" if info["legal"] else "[red]NO[/]"),
                f"{info['attn_input_units']:g}",
                signed_pct(info["attn_input_delta_pct"]),
                f"{info['layer_units']:g}",
                colls,
            )
    return k


def _print_reasons(console: Console, plans: list[dict]) -> None:
    """Each plan's root illegal edges (how many follow from them) and its engine gates."""
    for p in plans:
        if p["reasons"] or p["engine_notes"]:
            console.print(f"\n[bold]{escape(p['name'])}[/]:", markup=True)
        roots = [r for r in p["reasons"] if "(follows from" not in r]
        follow = len(p["reasons"]) - len(roots)
        for r in roots:
            print_wrapped(console, f"  - {r}")
        if follow:
            console.print(f"  ({follow} further illegal edges follow from these; `tpplan explain` shows them)")
        for note in p["engine_notes"]:
            print_wrapped(console, f"  note (engine gate, not legality): {note}")


def print_cp(cp: dict, tp: int) -> None:
    """The context-parallel table: per layer kind, its token split and what its mixers exchange over
    the CP group (per TP rank; `tpplan.layout.context_parallel`)."""
    console = make_console()
    if cp.get("layers") == "mla":
        title = (f"Context parallel, MLA layers only: CP{cp['cp']} inside TP{tp} (MLA attention TP "
                 f"{cp['attention_tp']}; per rank; AG units/tok = W)")  # fmt: skip
    else:
        title = (f"Context parallel: CP{cp['cp']} groups of TP{tp}, recurrence by {cp['recurrence']} "
                 "(per TP rank; AG units/tok = W)")  # fmt: skip
    t = Table(title=title)
    for col in ("layer kind", "split", "legal", "AG units/tok", "CP exchanges per layer"):
        t.add_column(col, justify="right" if col == "AG units/tok" else "left")
    for kind, info in cp["kinds"].items():
        xs = " + ".join(_cp_label(x) for x in info["exchanges"]) or (
            "none (own tokens only)" if cp.get("layers", "all") == "all" else "none (the full sequence, TP as planned)"
        )
        if info.get("replaces_plan_collectives_on"):
            xs += f", replacing the plan's collective on {'+'.join(info['replaces_plan_collectives_on'])}"
        legal = styled("yes" if info["legal"] else "[red]NO[/]")
        t.add_row(kind, info["split"], legal, f"{info['units_per_token']:g}", xs)
    show(console, t)
    for r in cp["reasons"]:
        print_wrapped(console, f"  - CP: {r}")


def _cp_label(x: dict) -> str:
    kind = {"all_gather": "AG", "send_recv": "SR", "all_reduce": "AR"}[x["collective"]]
    what = "+".join(x["values"])
    size = f"{x['elements_per_token']:g}/tok" if x["elements_per_token"] else f"{x['elements_per_seq']:g}/seq"
    chain = f" x{x['serial_steps']} serial" if x["serial_steps"] else ""
    return f"{kind}({what} {size}){chain}"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def print_crossover(rows: list[dict[str, object]]) -> None:
    console = make_console()
    t = Table(title="Where each plan overtakes baseline (one layer per kind, new tokens per step, no context)")
    for col in ("plan", "layer kind", "against baseline", "overtakes at", "stops at"):
        t.add_column(col, justify="right" if col.endswith(" at") else "left")
    for r in rows:
        up, down = r["overtakes_at_tokens"], r["stops_at_tokens"]
        t.add_row(str(r["plan"]), str(r["kind"]), str(r["summary"]), "-" if up is None else f"{up:,}",
                  "-" if down is None else f"{down:,}")  # fmt: skip
    show(console, t)


# Shown with --wide only: derivable from the others (compute = forward - comms), zero at PP1, or
# detail of the memory, TTFT and communication columns. The default tables fit 100 columns.
_WIDE_ONLY = {"compute", "replicated", "KV", "p50 s", "max s"}
_WIDE_ONLY_PER_LAYER = {"collectives"}


def print_fp8_note(topo: Topology, graph: ModelGraph, dtype: str, expert_dtype: str | None) -> None:
    """Under predicted times: that fp8 GEMMs were priced as bf16 ones, where the GPU has no fp8."""
    from tpplan.cost.gpu import fp8_fallback_note

    quant = graph.spec.quant
    note = fp8_fallback_note(topo.gpu, dtype, expert_dtype, quant is not None and quant.fmt.compute == "fp8")
    if note:
        print_wrapped(make_console(), note, indent=2)


def provenance_line(prov: dict | None) -> str:
    """The line under a table of predicted times: how they were made and the error band that applies
    (`tpplan.cost.provenance`); a difference between plans inside the band is too close to call."""
    if not prov:
        return "Times: byte volumes only (no topology), exact counts."
    band = f", error band ±{prov['band'] * 100:.1f}%" if prov["band"] else ""
    return f"Times: {prov['label']}{band} ({prov['basis']}); differences inside the band are too close to call."


def over_note(gpu_bytes: float, fixes: str) -> str:
    """The one line under a table whose memory column says (over): what it means and what to do."""
    return (
        f"(over): the predicted memory per rank exceeds one GPU's {_fmt_bytes(gpu_bytes)} in this topology, "
        f"so the plan does not fit as set up. Fix: {fixes}."
    )


def print_predictions(data: dict, wide: bool = False, cluster: str | None = None) -> None:
    """The audit's predictions on a topology: per plan its times, memory and TTFT, the lines that say how
    sure they are and what they assume, then per plan and layer kind the time of one layer."""
    console = make_console(wide=wide)
    first = next(p["prediction"] for p in data["plans"] if p.get("prediction"))
    show(console, _predictions_table(data["plans"], first, wide, cluster), wrap=("memory",))
    _print_prediction_notes(console, data["plans"], first, wide)
    show(console, _per_layer_table(data["plans"], wide))


def _predictions_table(plans: list[dict], first: dict, wide: bool, cluster: str | None) -> Table:
    """Per plan: forward time and its parts, memory per rank, TTFT (ms per batch; `--wide`: every column)."""
    r = first.get("replicas", 1)
    head = (
        f"Predicted on {cluster or first['topology']}: "
        + (f"{r} replicas of " if r > 1 else "")
        + f"TP{first['tp']}"
        + (f" x CP{first['cp']}" if first.get("cp", 1) > 1 else "")
        + f" x PP{first['pp']}, one batch of "
        f"{first['tokens']} tokens" + (f", workload {first['workload']}" if first["workload"] else "")
    )
    t = Table(title=head + " (ms per batch; memory per rank)")
    cols = ["plan", "legal", "forward", "compute", "TP comm", "stage send", "redundant", "memory", "replicated", "KV"]
    cols += ["TTFT mean s", "p50 s", "max s", "tok/s"]
    hidden = set() if wide else _WIDE_ONLY | ({"stage send"} if first["pp"] == 1 else set())
    cols = [c for c in cols if c not in hidden]
    for col in cols:
        t.add_column(
            col, justify="left" if col in ("plan", "legal") else "right", min_width=18 if col == "plan" else None
        )
    for p in plans:
        pr = p.get("prediction")
        if not pr:
            continue
        m = pr["memory_bytes_per_rank"]
        ttft = pr["ttft"]
        loop = (p.get("serving") or {}).get("ttft")
        if ttft and loop:  # the serving loop's, fixed costs included: what search ranks and the memo judges by
            ttft = {**ttft, **loop, "throughput_tok_s": loop.get("prefill_tok_s", ttft["throughput_tok_s"])}
        cells = {
            "plan": p["name"],
            "legal": styled("yes" if p["legal"] else "[red]NO[/]"),
            "forward": _ms(pr["forward_s"]),
            "compute": _ms(pr["compute_s"]),
            "TP comm": _ms(pr["comm_s"]),
            "stage send": _ms(pr["stage_comm_s"]),
            "redundant": _ms(pr["redundant_compute_s"]),
            "memory": styled(_fmt_bytes(m["total"]) + ("" if m["fits"] else " [red](over)[/]")),
            "replicated": _fmt_bytes(m["replicated_extra"]),
            "KV": _fmt_bytes(m["kv_cache"]),
            "TTFT mean s": f"{ttft['mean_s']:.3f}" if ttft else "",
            "p50 s": f"{ttft['p50_s']:.3f}" if ttft else "",
            "max s": f"{ttft['max_s']:.3f}" if ttft else "",
            "tok/s": f"{ttft['throughput_tok_s']:,.0f}" if ttft else "",
        }
        t.add_row(*(cells[c] for c in cols))
    return t


def _print_prediction_notes(console: Console, plans: list[dict], first: dict, wide: bool) -> None:
    """Under the predictions: their band, what replicas mean, the extrapolated ops, a plan that does not
    fit, and what `--wide` adds."""
    # the question's band: the baseline's prediction, as search and the memo state it (question_provenance)
    ref = next((p["prediction"] for p in plans if p["name"] == "baseline" and p.get("prediction")), first)
    console.print(provenance_line(ref.get("provenance")), markup=False)
    r = first.get("replicas", 1)
    if r > 1:
        console.print(
            f"Replicas: times and memory per rank are one replica's; TTFT is over every request, the workload's "
            f'requests split between the {r} replicas (each its own scheduler; docs/cost-model.md, "Replicas").',
            markup=False,
        )
    extrapolated = sorted({op for p in plans for op in (p.get("prediction") or {}).get("extrapolated_ops", [])})
    if extrapolated:
        console.print(
            f"Extrapolated: {len(extrapolated)} op(s) priced outside the shapes their measurements cover (the "
            f"GEMM table's, the kernel models' sweeps) ({', '.join(extrapolated[:6])}"
            f"{', ...' if len(extrapolated) > 6 else ''}); those times are less sure.",
            markup=False,
        )
    over = None  # the GPU's memory, where a plan's prediction exceeds it
    for p in plans:
        m = (p.get("prediction") or {}).get("memory_bytes_per_rank")
        if m is not None and not m["fits"]:
            over = m["gpu"]
    if over is not None:
        fixes = "a larger --tp or --pp, or quantized experts (--expert-dtype fp8 or mxfp4)"
        console.print(over_note(over, fixes), markup=False)
    if not wide:
        console.print("(--wide adds compute, replicated weight, KV cache, p50/max TTFT and collectives)")


def _per_layer_table(plans: list[dict], wide: bool) -> Table:
    """Per plan and layer kind: one layer's compute and communication (not overlapped), its slowest ops."""
    k = Table(title="Per layer of each kind (ms per batch): compute + communication, not overlapped")
    kcols = ["plan", "layer kind", "compute", "comm", "total", "redundant", "slowest ops", "collectives"]
    kcols = [c for c in kcols if wide or c not in _WIDE_ONLY_PER_LAYER]
    for col in kcols:
        k.add_column(col, justify="left" if col in ("plan", "layer kind", "slowest ops", "collectives") else "right")
    for p in plans:
        pr = p.get("prediction")
        if not pr:
            continue
        for kind, info in pr["layer_kinds"].items():
            slow = sorted(info["ops"], key=lambda o: -o["seconds"])[:3]
            cells = {
                "plan": p["name"],
                "layer kind": f"{kind} x{info['count']}",
                "compute": _ms(info["compute_s"]),
                "comm": _ms(info["comm_s"]),
                "total": _ms(info["total_s"]),
                "redundant": _ms(info["redundant_s"]),
                "slowest ops": ", ".join(f"{o['op']} {o['seconds'] * 1e3:.2f}" for o in slow),
                "collectives": " ".join(
                    f"{COLLECTIVE_SHORT[c['kind']]} {c['seconds'] * 1e3:.2f}" for c in info["collectives"]
                ),
            }
            k.add_row(*(cells[c] for c in kcols))
    return k
