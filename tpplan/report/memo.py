"""Lay the analysis out as the decision memo: answer first, then the evidence.

Order: the question and the answer (prose.py), then the plots a reader checks it against (TTFT,
time per layer kind, volume), how sure the predictions are, the per-plan verdicts with their
formulas, the per-MLA-layer table re-derived, the thresholds (crossover.py), where tpplan's richer
model differs (differences.py), the ranked next steps, the engine flags, and, when a benchmark file
is given, measured against predicted. Each section is one function returning blocks; `build_memo`
only concatenates them. In HTML long tables and the per-plan reasons are folded (`doc.Fold`,
`doc.FOLD_ROWS`) so the answer and the plots are on the first screens.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from tpplan.cost.bands import own_bands_notes
from tpplan.cost.provenance import BANDS, Provenance
from tpplan.errors import TpplanError
from tpplan.models.spec import MLASpec
from tpplan.report.deployment_sections import deployments_section, prompt_length_section
from tpplan.report.doc import Block, Bullets, Code, Fold, Heading, Image, Para, Table, to_html, to_markdown
from tpplan.report.prose import answer
from tpplan.report.results import Analysis, held_weights, kind_times, ttft_mean
from tpplan.simulate.engine import pp_unpriced
from tpplan.units import gib, pct_change, signed_pct

PNG_VOLUME = "volume_vs_tp.png"
PNG_TIME = "time_per_layer_kind.png"
PNG_TTFT = "ttft.png"

PNG_CROSS = "crossover.png"


def load_plots() -> ModuleType:
    """The plotting module; matplotlib is imported only when a memo is really drawn."""
    try:
        from tpplan.report import plots
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("matplotlib"):
            raise TpplanError(
                "tpplan report", "matplotlib is not installed", "pip install 'tpplan[report]' (or matplotlib)"
            ) from None
        raise
    return plots


@dataclass(frozen=True)
class Memo:
    title: str
    markdown: str
    html: str
    pngs: dict[str, bytes]


def _priced(a: Analysis, keys: list[str]) -> tuple[list[str], Para | None]:
    """The plans a time plot shows: the legal ones. An illegal plan computes another function, so its
    predicted time is no price; the plot leaves it out and a line says which were left out."""
    illegal = [k for k in keys if (v := a.variant(k)) is not None and not v.legal]
    if not illegal:
        return keys, None
    names = ", ".join(f"`{k}`" for k in illegal)
    return [k for k in keys if k not in illegal], Para(
        f"Not plotted: {names} ({'it is' if len(illegal) == 1 else 'they are'} illegal: the result would be "
        "wrong, so a predicted time is no price; the table below keeps the rows, marked `NO`)."
    )


class _Pngs(dict[str, bytes]):
    """The memo's PNGs by file name, filled as sections draw them."""


def intro(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    topo = a.topology
    wl_names = ", ".join(
        f"`{w.name}` ({w.input_len or 'mixed'} -> {w.output_len}, C={w.concurrency}, chunk {w.chunk_size})"
        for w in a.workloads
    )
    counts = ", ".join(f"{k} x{c}" for k, c in a.graph.counts().items())
    net = f", {topo.inter.nics_per_node} x {topo.inter.nic_Gbps:g} Gb/s NICs per node" if topo.inter is not None else ""
    b: list[Block] = [
        Para(
            f"Model `{a.model}` (hidden {a.graph.hidden}, {a.graph.spec.num_layers} layers: {counts}); topology "
            f"`{topo.name}`: {topo.nodes} x {topo.gpus_per_node} {topo.gpu.name}, {topo.intra.kind} "
            f"{topo.intra.bandwidth_GBps:g} GB/s{net}; workloads {wl_names}; activations {a.dtype}; today's "
            f"deployment (`--current`): `{a.current.key}` (TP{a.current.tp}"
            + (f" x PP{a.current.pp}" if a.current.pp > 1 else "")
            + ")."
        )
    ]
    if a.arrival is not None:  # asked for: the default, each workload's closed loop, is its C requests at once
        b.append(Para(f"TTFT, its ranking and verdicts are the engine's serving loop with arrivals: "
                      f"{a.arrival.describe()} (`--arrival-rate`, `--trace`, `--requests`, `--seed`)."))  # fmt: skip
    if command:
        b.append(Para(f"Regenerate with `{command}`."))
    if a.predictor_note:
        b.append(Para(f"**Note:** {a.predictor_note}"))
    return b


def answer_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    return [Heading("Answer"), *(Para(x) for x in answer(a))]


def kernel_source_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    """Today's deployment and the bottom line's target priced from each kernel-price source."""
    ks = a.kernel_sources
    if ks is None:
        return []
    off = ks.disagreeing()
    rows = tuple(
        (
            f"`{s.target}`",
            s.label + (" **(this memo)**" if s.name == ks.chosen else ""),
            f"{s.current_s:.3f}",
            f"{s.target_s:.3f}",
            f"{100 * s.change:+.1f}%",
            f"±{100 * s.band:.1f}%",
            "yes" if s in off else "",
        )
        for s in ks.answers
    )
    head = ("plan", "kernel prices from", f"`{ks.current}` s", "plan s", "change", "band", "disagrees")
    out: list[Block] = [
        Heading("Kernel-price source"),
        Para(
            f"The bottom line's plan and each source's own best plan that an engine runs at today's shape, "
            f"priced from each source of kernel prices (mean TTFT at {ks.workload}; collectives and everything "
            f"else as the memo prices them). {ks.reason} A source disagrees where its change differs from this "
            "memo's for the same plan by more than the two bands together."
        ),
        Table(head, rows, (2, 3, 4, 5)),
    ]
    if ks.skipped:
        out.append(Para("Not compared: " + "; ".join(ks.skipped) + "."))
    return out


def how_sure(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    """The provenance table: which band applies to this memo's predicted times, and why."""
    if a.predictor_note:
        return []

    def band_cell(p: Provenance) -> str:
        if p.key == "measured":
            return "-"
        if a.provenance.parts and p.key == a.provenance.key:  # this memo's: the band composed from its parts
            return f"±{100 * a.provenance.band:.1f}% (composed below; the source's own ±{100 * p.band:.1f}%)"
        return f"±{100 * p.band:.1f}%"

    rows = tuple(
        (
            p.label,
            band_cell(p),
            "**this memo**" if p is a.provenance or (a.provenance.parts and p.key == a.provenance.key) else "",
            p.basis,
        )
        for p in BANDS.values()
    )
    out: list[Block] = [
        Heading("How sure"),
        Para(
            "Every predicted time below is labelled by where it comes from. The band is the measured error of such "
            "predictions; a verdict whose predicted gain (or loss) lies inside it is TOO CLOSE (to call), not YES "
            "or NO. Measured times (the bench section) carry no model band."
        ),
    ]
    parts = a.provenance.parts
    if parts:  # the band composed from what the current deployment's predicted time sums
        out.append(Para(
            f"This memo's band, ±{100 * a.provenance.band:.1f}%, is the sum over the op classes and collectives "
            "of the current deployment's predicted time of (share of the time x out-of-sample error of that class "
            "and source); the errors and their bases are in tpplan/cost/presets/bands/errors.toml."
        ))  # fmt: skip
        part_rows = tuple(
            (p.klass, p.source, f"{100 * p.share:.1f}%", f"±{100 * p.error:.1f}%", f"{100 * p.share * p.error:.2f}%")
            for p in parts
        )
        out.append(Table(("class", "priced by", "share of time", "error", "adds"), part_rows, (2, 3, 4)))
        out.extend(Para(n) for n in own_bands_notes(parts))
        gpu = a.topology.gpu
        if gpu.provenance:
            out.append(Para(f"Compute on GPU model `{a.topology.gpu_preset or gpu.name}`: " + "; ".join(
                f"{k}: {v}" for k, v in gpu.provenance.items()) + "."))  # fmt: skip
        out.append(Para("Basis of each error: " + "; ".join(
            f"{p.klass}/{p.source}: {p.basis}" for p in parts) + "."))  # fmt: skip
        extra = _extrapolated_ops(a)
        if extra:
            out.append(Para(
                f"Extrapolated: {len(extra)} op(s) of the plans compared were priced outside the shapes their "
                "measurements cover (GEMMs below the GEMM table's smallest M, K or N; kernel models outside the "
                "ranges their sweep measured); the band above does not cover them."
            ))  # fmt: skip
    out.append(Table(("provenance", "band", "applies", "measured on"), rows, (1,)))
    return out


def verdict_table(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    w = a.first_workload
    ref = a.current
    t_ref = ttft_mean(ref, w) if w else None
    rows = []
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        t = ttft_mean(v, w) if w else None
        rows.append(
            (
                f"`{v.key}`",
                vd.status,
                "yes" if v.legal else "NO",
                f"{v.audit.comm_bytes_per_token:,.0f}",
                f"{v.audit.units:,.0f}",
                gib(held_weights(v)[1]),
                "-" if t is None else f"{t:.3f}",
                "-" if t is None or not t_ref else signed_pct(pct_change(t, t_ref)),
                vd.headline,
            )
        )
    label = f"mean TTFT s ({w}, {a.provenance.key})" if w else "mean TTFT s"
    return [
        Heading("Verdict per plan"),
        Table(
            (
                "plan",
                "verdict",
                "legal",
                "bytes/token/rank",
                "units/token",
                "replicated/rank",
                label,
                f"vs `{ref.key}`",
                "why",
            ),
            tuple(rows),
            (3, 4, 5, 6, 7),
        ),
        Para(
            "Relative units per token: all-reduce = 2W, reduce-scatter = all-gather = W, all-to-all = W/N, W the "
            "moved width; bytes are ring volumes with the (N-1)/N factor, whole model, per rank."
        ),
    ]


def per_plan(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    b: list[Block] = []
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        which = "MLA" if any(isinstance(lg.spec.attn, MLASpec) for lg in a.graph.kinds.values()) else "first"
        items = [f"attention-input boundary ({which} kind): `{vd.formula}`"] if vd.formula else []
        items += list(vd.reasons[:6])
        if len(vd.reasons) > 6:
            items.append(f"... and {len(vd.reasons) - 6} more root edges (`tpplan audit --plan {v.plan.name}`)")
        b.append(Heading(f"`{v.key}`: {vd.status}", 3))
        b.append(Para(v.plan.summary))
        if items:
            b.append(Bullets(tuple(items)))
    return [Fold(f"Each plan: what it does, its formula and its reasons ({len(a.variants)} plans)", tuple(b))]


def mla_table(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    if not a.boundary_rows:
        return []
    base = a.boundary_rows[0].units
    title = (
        "The seed's table, re-derived from the model graph"
        if a.asks_the_seed_question
        else ("The MLA layer's attention input, re-derived from the model graph")
    )
    return [
        Heading(title),
        Table(
            (
                "path",
                "formula",
                "hand units",
                "tpplan plan",
                "tpplan units",
                "vs all-reduce",
                "legal",
                "tpplan formula",
            ),
            tuple(
                (
                    r.path,
                    r.hand_formula,
                    f"{r.hand_units}",
                    f"`{r.plan}`",
                    f"{r.units:g}",
                    signed_pct(pct_change(r.units, base)) if base else "-",
                    "yes" if r.legal else "NO",
                    f"`{r.formula}`",
                )
                for r in a.boundary_rows
            ),
            (2, 4, 5),
        ),
    ]


def volume(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    pngs[PNG_VOLUME] = plots.volume_vs_tp(a.volume_vs_tp, f"{a.model}: communication per token per rank")
    sizes = sorted({n for pts in a.volume_vs_tp.values() for n, _ in pts})
    rows = tuple(
        (f"`{name}`", *(next((f"{y:,.0f}" for x, y in pts if x == n), "-") for n in sizes))
        for name, pts in a.volume_vs_tp.items()
    )
    return [
        Heading("Volume per plan versus TP size"),
        Image(PNG_VOLUME, "bytes per token per rank against TP size, one line per plan", pngs[PNG_VOLUME]),
        Table(("plan", *(f"TP{n}" for n in sizes)), rows, tuple(range(1, 1 + len(sizes)))),
    ]


def kind_time(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    b: list[Block] = [Heading("Time per layer kind per plan")]
    times = {v.key: kt for v in a.variants if (kt := kind_times(v))}
    if not times:
        return [*b, Para("Not available: needs the time predictor (see the note above).")]
    chunk = a.workloads[0].chunk_size if a.workloads else 0
    shown, left_out = _priced(a, list(times))
    pngs[PNG_TIME] = plots.stacked_time(
        {k: times[k] for k in shown}, f"predicted time of one {chunk}-token batch, by layer kind"
    )
    kinds = sorted({k for t in times.values() for k in t})
    b.append(Image(PNG_TIME, "stacked predicted time per layer kind per legal plan", pngs[PNG_TIME]))
    b += [left_out] if left_out else []
    b.append(Para(f"Predicted, {a.provenance.label} (band ±{100 * a.provenance.band:.1f}%)." + _extrapolated(a)))
    b.append(
        Table(
            ("plan", "total ms", *kinds),
            tuple(
                (f"`{k}`", f"{sum(t.values()) * 1e3:,.1f}", *(f"{t.get(kind, 0.0) * 1e3:,.1f}" for kind in kinds))
                for k, t in times.items()
            ),
            tuple(range(1, 2 + len(kinds))),
        )
    )
    return b


def ttft_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    b: list[Block] = [Heading("TTFT per plan")]
    ttft = {v.key: {w.name: m for w in a.workloads if (m := ttft_mean(v, w.name)) is not None} for v in a.variants}
    ttft = {k: t for k, t in ttft.items() if t}
    if not ttft:
        return [*b, Para("Not available: needs the time predictor (see the note above).")]
    shown, left_out = _priced(a, list(ttft))
    pngs[PNG_TTFT] = plots.grouped_bars(
        {k: ttft[k] for k in shown}, "predicted mean TTFT per legal plan", "mean TTFT (s)"
    )
    b.append(Image(PNG_TTFT, "predicted mean TTFT per legal plan per workload", pngs[PNG_TTFT]))
    b += [left_out] if left_out else []
    b.append(Para(f"Predicted, {a.provenance.label} (band ±{100 * a.provenance.band:.1f}%)." + _extrapolated(a)))
    rows = []
    for v in a.variants:
        for w in a.workloads:
            p = v.predictions.get(w.name)
            t = getattr(p, "ttft", None)
            if t is None:
                continue
            mem = getattr(p, "memory", None)
            rows.append(
                (
                    f"`{v.key}`",
                    w.name,
                    f"{t.mean_s:.3f}",
                    f"{t.p50_s:.3f}",
                    f"{t.max_s:.3f}",
                    f"{t.throughput_tok_s:,.0f}",
                    gib(mem.total) if mem is not None else "-",
                    "yes" if v.legal else "NO",
                )
            )
    b.append(
        Table(
            ("plan", "workload", "mean s", "p50 s", "max s", "prefill tok/s", "memory/rank", "legal"),
            tuple(rows),
            (2, 3, 4, 5, 6),
        )
    )
    return b


def thresholds(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    """Where each plan overtakes baseline, per layer kind, over prefill batch sizes."""
    if not a.crossovers:
        return []
    grid = a.crossovers[0].tokens
    series = {
        (c.kind, c.plan): [(t, p / b) for t, p, b in zip(c.tokens, c.plan_s, c.base_s, strict=True) if b]
        for c in a.crossovers
    }
    pngs[PNG_CROSS] = plots.crossover(series, f"{a.model} TP{a.tp}: plan time / baseline time per layer")
    rows = tuple(
        (
            f"`{c.plan}`",
            c.kind,
            c.describe(),
            "-" if c.overtakes_at is None else f"{c.overtakes_at:,.0f}",
            "-" if c.stops_at is None else f"{c.stops_at:,.0f}",
        )
        for c in a.crossovers
    )
    return [
        Heading("Thresholds: where a plan overtakes baseline"),
        Para(
            f"One layer of each kind (and the whole model) priced by the cost model at {grid[0]:,}-{grid[-1]:,} "
            f"new tokens per step (no cached context), TP{a.tp}, {a.provenance.label}; crossings interpolated in "
            "log(tokens). Below a plan's threshold an engine should fall back to baseline. "
            "`tpplan audit --crossover` prints the same (JSON: docs/audit-json.md)."
        ),
        Image(
            PNG_CROSS, "plan time over baseline time against tokens per step, one panel per layer kind", pngs[PNG_CROSS]
        ),
        Table(("plan", "layer kind", "against baseline", "overtakes at tokens", "stops at tokens"), rows, (3, 4)),
    ]


def differences_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    if not a.differences:
        return []
    title = (
        "Where tpplan's model differs from the seed's hand analysis"
        if a.asks_the_seed_question
        else ("Where tpplan's model goes beyond a byte count")
    )
    b: list[Block] = [Heading(title)]
    if not a.predictor_note:
        b.append(Para(f"Times here are predicted, {a.provenance.label} (band ±{100 * a.provenance.band:.1f}%)."))
    for t, text in a.differences:
        b += [Heading(t, 3), Para(text)]
    return b


def next_steps_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    b: list[Block] = [Heading("Next steps, ranked by predicted gain")]
    if not a.next_steps:
        return [*b, Para(f"No legal plan that fits in memory beats today's `{a.current.key}`.")]
    b.append(
        Table(
            ("rank", "plan", "gain", "beyond band", "basis", "price", "engine"),
            tuple(
                (
                    str(i),
                    f"`{s.key}`",
                    s.gain_text(),
                    ("yes" if s.clear else "no") if s.timed else "-",
                    s.basis,
                    s.price,
                    s.engine,
                )
                for i, s in enumerate(a.next_steps, 1)
            ),
            (2,),
        )
    )
    return b


def engines_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    b: list[Block] = [
        Heading("Engine flags"),
        Para(
            f"Judged against {' and '.join(f'`{k}`' for k in a.engines)} (tpplan's engine data, `tpplan/engines/`; "
            "`--engine sglang@VERSION` or `vllm@VERSION` selects another version; docs/engines.md lists them with "
            "their sources). Flags that realise each plan, and the engine's own conditions. Under `FAILS`: "
            "`runs baseline` means the server starts and runs the all-reduce path; `refuses`, it does not start; "
            "`asserts`, a batch that fails it stops the server; `falls back`, it runs the same collectives on a "
            "slower path (NCCL instead of a fused kernel); `keep` conditions depend on settings the memo cannot "
            "see. The engine verdict follows a plan's decisions, not its name; each condition names its source."
        ),
    ]
    rows = [
        (
            f"`{v.key}`",
            e.version or e.engine,
            e.realises + (" (blocked)" if e.blocked else ""),
            e.flags_text() if e.realises != "no" else "-",
            e.summary,
        )
        for v in a.variants
        for e in v.engines
    ]
    b.append(Table(("plan", "engine", "realised", "flags", "what it does"), tuple(rows)))
    nxt = a.variant(a.bottom.target) if a.bottom is not None else None
    shown = [("today's deployment", a.current)]
    if nxt is not None and nxt is not a.current:
        shown.append(("the bottom line's choice", nxt))
    for name in ("sglang-input-scattered", "input-scattered"):
        scat = a.variant(name)
        if scat is not None and all(scat is not v for _, v in shown):
            shown.append((name, scat))
    # What --moe-a2a-backend deepep runs on this model class (its path sentence names the default dataflow).
    a2a = next((v for v in map(a.variant, ("sglang-sp-moe", "sp-moe")) if v is not None), None)
    if a2a is not None and all(a2a is not v for _, v in shown):
        shown.append(("SGLang's MoE all-to-all path", a2a))
    for title, v in shown:
        b.append(Heading(f"{title}: {v.key}", 3))
        for e in v.engines:
            if e.path:
                b.append(Para(e.path))
            if e.realises == "no":
                b.append(Para(f"{e.engine}: no flag; {e.summary}."))
                continue
            b.append(Code(e.command(), "bash"))
            items = [c.line() for c in e.conditions] + list(e.notes)
            if items:
                b.append(Bullets(tuple(items)))
    b += _pipeline_engines(a)
    return b


def _pipeline_engines(a: Analysis) -> list[Block]:
    """How each engine schedules PP for prefill, and the behaviour tpplan's PP prediction assumes
    (worded from the schedule that priced it: `cost.pipeline`); only where the memo has a PP deployment."""
    pps = [v for v in a.variants if v.pp > 1]
    if not pps:
        return []
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.engines import select

    items = []
    model_type = a.graph.spec.model_type  # a boundary clause for another model (K3's bank) is not printed
    for key in a.engines:
        ev = select(key)
        p = ev.pipeline
        items.append(
            f"{ev.engine} {ev.version}: in flight: {p.in_flight} ({p.source.cite()}); chunks of one prompt: "
            f"{p.chunks_of_one_request} ({p.chunks_source.cite()}); stage boundary: {p.boundary_for(model_type)} "
            f"({p.boundary_source.cite()})."
        )
    model = pipeline_model(a.pp_engine or None)
    assumed = model.assumption(pps[0].parallel) + "."
    if unpriced := pp_unpriced(model):  # the serving loop prices the rest (tpplan.simulate)
        assumed += f" Not priced ({model.label}): " + "; ".join(unpriced) + "."
    return [Heading("Pipeline parallelism as the engines schedule it", 3), Bullets(tuple(items)), Para(assumed)]


from tpplan.report.serving_section import serving_section  # noqa: E402

SECTIONS = (
    intro,
    answer_section,
    serving_section,
    kernel_source_section,
    ttft_section,
    kind_time,
    volume,
    how_sure,
    verdict_table,
    per_plan,
    mla_table,
    deployments_section,
    prompt_length_section,
    thresholds,
    differences_section,
    next_steps_section,
    engines_section,
)


def build_memo(a: Analysis, command: str = "") -> Memo:
    """The memo's blocks, rendered to markdown and HTML, and its PNGs."""
    from tpplan.report.bench_section import bench_section

    plots = load_plots()
    topo = a.topology
    cluster = f"{topo.nodes} x {topo.gpus_per_node} GPUs"
    title = f"tpplan decision memo: {a.model} prefill on {topo.name}, {cluster} (TP{a.tp})"
    pngs = _Pngs()
    blocks: list[Block] = []
    for section in (*SECTIONS, bench_section):
        blocks += section(a, command, plots, pngs)
    return Memo(title, to_markdown(title, blocks), to_html(title, blocks), dict(pngs))


def _extrapolated_ops(a: Analysis) -> list[str]:
    """`kind/op` of every op some compared prediction priced outside the shapes its measurements cover."""
    return sorted({op for v in a.variants for p in v.predictions.values() for op in getattr(p, "extrapolated_ops", [])})


def _extrapolated(a: Analysis) -> str:
    """A sentence naming the ops priced outside the shapes their measurements cover, if any."""
    ops = _extrapolated_ops(a)
    if not ops:
        return ""
    shown = ", ".join(f"`{o}`" for o in ops[:8]) + (", ..." if len(ops) > 8 else "")
    return (
        f" {len(ops)} op(s) were priced outside the shapes their measurements cover (GEMMs below the GEMM "
        f"table's smallest M, K or N; kernel models outside their sweep's ranges), extrapolated and less sure "
        f"than the band says: {shown}."
    )
