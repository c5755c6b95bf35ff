"""Lay the analysis out as the decision memo: answer first, then the evidence.

Order follows the seed memo: the question and the answer, the per-plan verdicts with their
formulas, the seed's table re-derived, where tpplan's richer model differs, the ranked next steps,
the engine flags, and, when a benchmark file is given, measured against predicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from tpplan.errors import TpplanError
from tpplan.report.analysis import Analysis, kind_times, ttft_mean
from tpplan.report.bench_results import error_summary
from tpplan.report.doc import Block, Bullets, Code, Heading, Image, Para, Table, to_html, to_markdown

PNG_VOLUME = "volume_vs_tp.png"
PNG_TIME = "time_per_layer_kind.png"
PNG_TTFT = "ttft.png"
PNG_BENCH = "predicted_vs_measured.png"


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


def _gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"


def _label(a: Analysis, key: str) -> str:
    """Plot label: illegal plans are marked so a short bar is not read as a recommendation."""
    v = a.variant(key)
    return f"{key}\n(ILLEGAL)" if v is not None and not v.legal else key


def _answer(a: Analysis) -> list[Block]:
    v_is = a.variant("input-scattered")
    base = a.baseline
    out: list[Block] = []
    lines = []
    if v_is is not None:
        verdict = next(x for x in a.verdicts if x.key == v_is.key)
        lines.append(
            f"**Does SGLang's input-scattered (TP reduce-scatter) prefill pay off for {a.model} at TP{a.tp}?** "
            f"**{'No' if verdict.status == 'NO' else 'Yes'}**: {verdict.headline}."
        )
        if not v_is.legal:
            roots = [v for v in v_is.audit.violations if not v.consequence_of]
            ops = ", ".join(sorted({f"{v.op} ({v.layer_kind})" for v in roots}))
            lines.append(
                f"The edges that break it: {ops}. Each is a column-parallel projection that needs every token of "
                "the full hidden, while a reduce-scatter leaves each rank only its own tokens."
            )
            gate = next((v for v in roots if v.op == "g_proj" and "mla" in v.layer_kind), None)
            if gate is not None:
                lines.append(f"The MLA output gate, in the audit's words: {gate.sentence()}")
        if len(a.boundary_rows) >= 3:
            r0, r1 = a.boundary_rows[0], a.boundary_rows[1]
            legal = [r for r in a.boundary_rows[2:] if r.legal]
            lines.append(
                f"Per MLA layer, in the seed's units: the all-reduce costs {r0.units:g}; the DeepSeek path would cost "
                f"{r1.units:g} ({100 * (r1.units - r0.units) / r0.units:+.1f}%) but is "
                + ("illegal here" if not r1.legal else "legal here")
                + (
                    "; the legal ways to keep it ("
                    + ", ".join(f"`{r.plan}`" for r in legal)
                    + f") cost {legal[0].units:g} ({100 * (legal[0].units - r0.units) / r0.units:+.1f}%)."
                    if legal
                    else "."
                )
            )
        for name in ("input-scattered+restore", "latent-scattered"):
            v = a.variant(name)
            if v is not None and v.legal:
                d = (
                    100
                    * (v.audit.comm_bytes_per_token - base.audit.comm_bytes_per_token)
                    / base.audit.comm_bytes_per_token
                )
                lines.append(
                    f"The legal variant `{name}` moves {d:+.1f}% bytes per token per rank against baseline "
                    f"({v.audit.comm_bytes_per_token:,.0f} vs {base.audit.comm_bytes_per_token:,.0f})."
                )
    if a.next_steps:
        top = a.next_steps[0]
        lines.append(
            f"**Keep today's deployment for now; the best next step is `{top.key}`** ({top.basis}: "
            + (f"{top.gain:.3f} s" if "TTFT" in top.basis else f"{100 * top.gain:.1f}%")
            + f"; price: {top.price})."
        )
    else:
        lines.append("**Keep today's deployment**: no legal plan beats the baseline.")
    out += [Para(x) for x in lines]
    return out


def build_memo(a: Analysis, command: str = "") -> Memo:
    """The memo's blocks, rendered to markdown and HTML, and its PNGs."""
    plots = load_plots()
    topo = a.topology
    title = f"tpplan decision memo: {a.model} prefill on {topo.name} x{topo.nodes} (TP{a.tp})"
    pngs: dict[str, bytes] = {}
    b: list[Block] = []
    wl_names = ", ".join(
        f"`{w.name}` ({w.input_len or 'mixed'} -> {w.output_len}, C={w.concurrency}, chunk {w.chunk_size})"
        for w in a.workloads
    )
    counts = ", ".join(f"{k} x{c}" for k, c in a.graph.counts().items())
    b.append(
        Para(
            f"Model `{a.model}` (hidden {a.graph.hidden}, {a.graph.spec.num_layers} layers: {counts}); topology "
            f"`{topo.name}`: {topo.nodes} x {topo.gpus_per_node} {topo.gpu.name}, {topo.intra.kind} "
            f"{topo.intra.bandwidth_GBps:g} GB/s"
            + (
                f", {topo.inter.nics_per_node} x {topo.inter.nic_Gbps:g} Gb/s NICs per node"
                if topo.inter is not None
                else ""
            )
            + f"; workloads {wl_names}; activations {a.dtype}."
        )
    )
    if command:
        b.append(Para(f"Regenerate with `{command}`."))
    if a.predictor_note:
        b.append(Para(f"**Note:** {a.predictor_note}"))
    b.append(Heading("Answer"))
    b += _answer(a)

    # Verdicts
    b.append(Heading("Verdict per plan"))
    rows = []
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        rows.append(
            (
                f"`{v.key}`",
                vd.status,
                "yes" if v.legal else "NO",
                f"{v.audit.comm_bytes_per_token:,.0f}",
                f"{v.audit.units:,.0f}",
                _gib(v.audit.replicated_extra_bytes),
                vd.headline,
            )
        )
    b.append(
        Table(
            ("plan", "verdict", "legal", "bytes/token/rank", "rel. units/token", "replicated/rank", "why"),
            tuple(rows),
            (3, 4, 5),
        )
    )
    b.append(
        Para(
            "Relative units per token: all-reduce = 2W, reduce-scatter = all-gather = W, all-to-all = W/N per token, "
            "W the moved width; bytes are ring volumes with the (N-1)/N factor, whole model, per rank."
        )
    )
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        if vd.status == "reference" and not vd.formula:
            continue
        which = "MLA" if "mla" in " ".join(v.audit.kinds) else "first"
        items = [f"attention-input boundary ({which} kind): `{vd.formula}`"]
        items += list(vd.reasons[:6])
        if len(vd.reasons) > 6:
            items.append(f"... and {len(vd.reasons) - 6} more root edges (`tpplan audit --plan {v.plan.name}`)")
        b.append(Heading(f"`{v.key}`: {vd.status}", 3))
        b.append(Para(f"{v.plan.summary}"))
        b.append(Bullets(tuple(items)))

    # Seed table
    if a.boundary_rows:
        b.append(Heading("The seed's table, re-derived from the model graph"))
        b.append(
            Table(
                ("seed path", "seed formula", "seed units", "tpplan plan", "tpplan units", "legal", "tpplan formula"),
                tuple(
                    (
                        r.path,
                        r.hand_formula,
                        f"{r.hand_units}",
                        f"`{r.plan}`",
                        f"{r.units:g}",
                        "yes" if r.legal else "NO",
                        f"`{r.formula}`",
                    )
                    for r in a.boundary_rows
                ),
                (2, 4),
            )
        )
        base_units = a.boundary_rows[0].units
        rel = "; ".join(
            f"`{r.plan}` {100 * (r.units - base_units) / base_units:+.1f}%" for r in a.boundary_rows[1:] if base_units
        )
        b.append(Para(f"Against the all-reduce per MLA layer: {rel}."))

    # Plots
    b.append(Heading("Volume per plan versus TP size"))
    pngs[PNG_VOLUME] = plots.volume_vs_tp(a.volume_vs_tp, f"{a.model}: communication per token per rank")
    b.append(Image(PNG_VOLUME, "bytes per token per rank against TP size, one line per plan", pngs[PNG_VOLUME]))
    b.append(
        Table(
            ("plan", *(f"TP{n}" for n in sorted({n for pts in a.volume_vs_tp.values() for n, _ in pts}))),
            tuple(
                (
                    f"`{name}`",
                    *(
                        next((f"{y:,.0f}" for x, y in pts if x == n), "-")
                        for n in sorted({n for p in a.volume_vs_tp.values() for n, _ in p})
                    ),
                )
                for name, pts in a.volume_vs_tp.items()
            ),
            tuple(range(1, 1 + len({n for pts in a.volume_vs_tp.values() for n, _ in pts}))),
        )
    )
    times = {v.key: kt for v in a.variants if (kt := kind_times(v))}
    b.append(Heading("Time per layer kind per plan"))
    if times:
        chunk = a.workloads[0].chunk_size if a.workloads else 0
        labelled = {_label(a, k): t for k, t in times.items()}
        pngs[PNG_TIME] = plots.stacked_time(labelled, f"predicted time of one {chunk}-token batch, by layer kind")
        b.append(Image(PNG_TIME, "stacked predicted time per layer kind per plan", pngs[PNG_TIME]))
        b.append(
            Table(
                ("plan", "total ms", *sorted({k for t in times.values() for k in t})),
                tuple(
                    (
                        f"`{k}`",
                        f"{sum(t.values()) * 1e3:,.1f}",
                        *(f"{t.get(kind, 0.0) * 1e3:,.1f}" for kind in sorted({k for t in times.values() for k in t})),
                    )
                    for k, t in times.items()
                ),
                tuple(range(1, 2 + len({k for t in times.values() for k in t}))),
            )
        )
    else:
        b.append(Para("Not available: needs the time predictor (see the note above)."))
    b.append(Heading("TTFT per plan"))
    ttft = {v.key: {w.name: m for w in a.workloads if (m := ttft_mean(v, w.name)) is not None} for v in a.variants}
    ttft = {k: t for k, t in ttft.items() if t}
    if ttft:
        pngs[PNG_TTFT] = plots.grouped_bars(
            {_label(a, k): t for k, t in ttft.items()}, "predicted mean TTFT per plan", "mean TTFT (s)"
        )
        b.append(Image(PNG_TTFT, "predicted mean TTFT per plan per workload", pngs[PNG_TTFT]))
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
                        _gib(mem.total) if mem is not None else "-",
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
    else:
        b.append(Para("Not available: needs the time predictor (see the note above)."))

    # Differences
    b.append(Heading("Where tpplan's model differs from the seed's hand analysis"))
    for t, text in a.differences:
        b.append(Heading(t, 3))
        b.append(Para(text))

    # Next steps
    b.append(Heading("Next steps, ranked by predicted gain"))
    if a.next_steps:
        b.append(
            Table(
                ("rank", "plan", "gain", "basis", "price", "engine"),
                tuple(
                    (
                        str(i),
                        f"`{s.key}`",
                        f"{s.gain:.3f} s" if "TTFT" in s.basis else f"{100 * s.gain:.1f}%",
                        s.basis,
                        s.price,
                        s.engine,
                    )
                    for i, s in enumerate(a.next_steps, 1)
                ),
                (2,),
            )
        )
    else:
        b.append(Para("No legal plan beats the baseline."))

    # Engines
    b.append(Heading("Engine flags"))
    b.append(
        Para(
            "Flags that realise each plan, and the engine's own static conditions. `FAILS` under `skips silently` "
            "means the server starts and quietly runs the baseline path; `keep` conditions depend on other "
            "settings. Sources are repository paths in `tpplan/report/engines.py`."
        )
    )
    rows = []
    for v in a.variants:
        for e in v.engines:
            rows.append(
                (
                    f"`{v.key}`",
                    e.engine,
                    e.realises + (" (blocked)" if e.blocked else ""),
                    "`" + " ".join(e.args) + "`" if e.realises != "no" else "-",
                    e.summary,
                )
            )
    b.append(Table(("plan", "engine", "realised", "flags", "what it does"), tuple(rows)))
    rec_key = a.next_steps[0].key if a.next_steps else a.baseline.key
    rec = a.variant(rec_key) or a.baseline
    for key, v in (("baseline (run today)", a.baseline), (f"recommended next: {rec.key}", rec)):
        b.append(Heading(key, 3))
        for e in v.engines:
            if e.realises == "no":
                b.append(Para(f"{e.engine}: no flag; {e.summary}."))
                continue
            b.append(Code(e.command(), "bash"))
            items = [c.line() for c in e.conditions] + list(e.notes)
            if items:
                b.append(Bullets(tuple(items)))
    v_is = a.variant("input-scattered")
    if v_is is not None:
        b.append(Heading("input-scattered in SGLang", 3))
        for e in v_is.engines:
            if e.engine != "SGLang":
                continue
            b.append(Code(e.command(), "bash"))
            b.append(Bullets(tuple([c.line() for c in e.conditions] + list(e.notes))))

    # Bench
    if a.bench is not None:
        br = a.bench
        b.append(Heading("Measured against predicted"))
        b.append(
            Para(
                f"`{br.meta.command}` on {br.meta.machine} ({br.meta.gpus} x {br.meta.gpu}), {br.meta.date:%Y-%m-%d}, "
                f"torch {br.meta.torch_version}, NCCL {br.meta.nccl_version or '?'}; plan `{br.plan}` TP{br.tp}; "
                f"slice: {br.model_slice.description}; predictions on topology `{br.topology}`"
                + (
                    " (its kernel profiles price the non-GEMM ops the bench really ran)."
                    if any(o.profiled for o in br.ops)
                    else " (roofline kernel estimates)."
                )
            )
        )
        rows = []
        pts: list[tuple[str, float, float]] = []
        for name, items in (
            ("collective", br.collectives),
            ("op", br.ops),
            ("layer", br.layers),
            ("batch", br.batches),
        ):
            s = error_summary(list(items))
            med = "-" if s["median_abs_err"] is None else f"{100 * float(s['median_abs_err']):.1f}%"
            mx = "-" if s["max_abs_err"] is None else f"{100 * float(s['max_abs_err']):.1f}%"
            rows.append((name, str(len(items)), str(s["n"]), med, mx))
            pts += [(name, i.predicted_s, i.measured_s) for i in items if i.predicted_s is not None]
        targets = {"collective": "median <= 5%", "layer": "<= 10%"}
        rows = [(*r, targets.get(r[0], "")) for r in rows]
        b.append(
            Table(
                ("level", "measured", "with prediction", "median abs error", "worst", "issue target"),
                tuple(rows),
                (1, 2, 3, 4),
            )
        )
        over = [c.measured_s / c.direct_s - 1.0 for c in br.collectives if c.direct_s]
        if over:
            over.sort()
            mid = over[len(over) // 2] if len(over) % 2 else (over[len(over) // 2 - 1] + over[len(over) // 2]) / 2
            b.append(
                Para(
                    f"Runtime overhead of the plan's collectives over the same calls issued directly with "
                    f"torch.distributed ({len(over)} measured): median {100 * mid:+.1f}%, worst {100 * over[-1]:+.1f}% "
                    "(target: at most +3%)."
                )
            )
        if pts:
            pngs[PNG_BENCH] = plots.predicted_vs_measured(pts, f"{br.plan} TP{br.tp}: predicted vs measured")
            b.append(Image(PNG_BENCH, "predicted against measured time per item", pngs[PNG_BENCH]))
        with_err = [c for c in br.collectives if c.rel_error is not None]
        worst = sorted(with_err, key=lambda c: -abs(c.rel_error or 0.0))[:8]
        if worst:
            b.append(
                Table(
                    ("collective", "shape", "bytes", "measured ms", "predicted ms", "error"),
                    tuple(
                        (
                            c.label or c.kind,
                            "x".join(map(str, c.shape)),
                            f"{c.bytes:,}",
                            f"{c.measured_s * 1e3:.3f}",
                            f"{(c.predicted_s or 0.0) * 1e3:.3f}",
                            f"{100 * (c.rel_error or 0.0):+.1f}%",
                        )
                        for c in worst
                    ),
                    (2, 3, 4, 5),
                )
            )
        for t in br.ttft:
            pred = f" (predicted {t.predicted_mean_s:.3f} s)" if t.predicted_mean_s is not None else ""
            b.append(
                Para(
                    f"Extrapolated whole-model TTFT on `{t.topology}` at `{t.workload}`: mean {t.mean_s:.3f} s{pred}, "
                    f"p50 {t.p50_s:.3f} s, max {t.max_s:.3f} s."
                )
            )
    return Memo(title, to_markdown(title, b), to_html(title, b), pngs)
