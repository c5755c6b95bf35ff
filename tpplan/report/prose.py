"""The memo's answer, one small function per paragraph.

Each function reads the analysis and returns its paragraph, or None when the facts it would state
do not hold for this model, plan set and topology: the edges that break input-scattered only when
it is illegal, the output-gate quote only when an MLA output gate is among them, a legal variant's
own units and bytes, the bottom line from `verdicts.bottom_line`. Every number printed here is also
in a table of the memo (the generated-memo test checks it).
"""

from __future__ import annotations

from collections.abc import Callable

from tpplan.models.spec import MLASpec
from tpplan.placement import S_TOK, R
from tpplan.report.results import STATUS_WORDS, Analysis, ttft_mean
from tpplan.report.rows import fig
from tpplan.units import GIB

Paragraph = str | None


def _rel(x: float, base: float) -> str:
    return f"{100 * (x - base) / base:+.1f}%" if base else "n/a"


def _has_mla(a: Analysis) -> bool:
    """MLA attention (DeepSeek's, and the MLA-based DSA of DeepSeek-V3.2): what input-scattered is for."""
    attns = [lg.spec.attn for lg in a.graph.kinds.values()]
    return any(isinstance(x, MLASpec) or isinstance(getattr(x, "mla", None), MLASpec) for x in attns)


def engine_path(a: Analysis) -> Paragraph:
    """What SGLang really runs with --enable-attn-tp-input-scattered on this model class, with its
    source (the engine data, tpplan.engines), before any legality or volume."""
    v = a.variant("sglang-input-scattered")
    sgl = next((e for e in v.engines if e.engine == "SGLang"), None) if v is not None else None
    if sgl is None or not sgl.path:
        return None
    text = f"**What the engine runs ({sgl.version}).** {sgl.path}"
    if sgl.realises == "yes":
        text += f" Its dataflow: {sgl.summary}; the plan `sglang-input-scattered` is that dataflow, op by op."
    return text


def question(a: Analysis) -> Paragraph:
    """Does SGLang's input-scattered prefill pay off here? The word is the verdict table's status of
    the plan equal to what the flag runs (`sglang-input-scattered`) where SGLang wires the flag for the
    model class, else tpplan's `input-scattered`.
    Asked only of a model with MLA, the attention SGLang's input-scattered path was written for;
    other models get the neutral question the bottom line answers."""
    if not _has_mla(a):
        t = a.topology
        return (
            f"**Which prefill plan should {a.model} run on {t.name} ({t.nodes} x {t.gpus_per_node} GPUs), against "
            f"today's `{a.current.key}`?** The bottom line below answers; every plan's verdict is in the table."
        )
    v = a.variant("sglang-input-scattered")
    sgl = next((e for e in v.engines if e.engine == "SGLang"), None) if v is not None else None
    # The engine's own dataflow where SGLang wires the flag for this model class; where it does not (the
    # flag runs the baseline, said by `engine_path`), the question is tpplan's input-scattered rewrite.
    key = "sglang-input-scattered" if sgl is not None and sgl.realises == "yes" else "input-scattered"
    vd = a.verdict(key)
    if vd is None:
        return None
    return (
        f"**Does SGLang's input-scattered (TP reduce-scatter) prefill pay off for {a.model} at TP{a.tp}, against "
        f"today's `{a.current.key}`?** **{STATUS_WORDS[vd.status]}** ({vd.status}, `{key}`): {vd.headline}."
    )


def broken_edges(a: Analysis) -> Paragraph:
    """Which ops make input-scattered illegal, and why, from the audit's root violations."""
    v = a.variant("input-scattered")
    if v is None or v.legal:
        return None
    roots = [x for x in v.audit.violations if not x.consequence_of]
    ops = ", ".join(sorted({f"{x.op} ({x.layer_kind})" for x in roots}))
    text = f"The edges that break {'it' if _has_mla(a) else '`input-scattered`'}: {ops}."
    if roots and all(x.got is S_TOK and x.needs is R for x in roots):
        inputs = sorted({f"`{x.value}`" for x in roots})
        text += (
            f" Each needs every token of its input ({', '.join(inputs)}), while a reduce-scatter leaves each rank "
            "only its own tokens."
        )
    return text


def gate_quote(a: Analysis) -> Paragraph:
    """The audit's own sentence for an MLA output gate, when one breaks input-scattered."""
    v = a.variant("input-scattered")
    if v is None or v.legal:
        return None
    mla_kinds = {k for k, lg in a.graph.kinds.items() if isinstance(lg.spec.attn, MLASpec)}
    gated = any(getattr(a.graph.kinds[k].spec.attn, "output_gate", False) for k in mla_kinds)
    gate = next(
        (
            x
            for x in v.audit.violations
            if not x.consequence_of and x.op == "g_proj" and mla_kinds & set(x.layer_kind.split(", "))
        ),
        None,
    )
    if gate is None or not gated:
        return None
    return f"The MLA output gate, in the audit's words: {gate.sentence()}"


def boundary_units(a: Analysis) -> Paragraph:
    """Per MLA layer, each row of the re-derived table with its own units and change."""
    if len(a.boundary_rows) < 2:
        return None
    r0, rest = a.boundary_rows[0], a.boundary_rows[1:]
    parts = [
        f"`{r.plan}` {r.units:g} ({_rel(r.units, r0.units)}, {'legal' if r.legal else 'illegal'} here)" for r in rest
    ]
    lead = "in relative units (the seed's)" if a.asks_the_seed_question else "in relative units (all-reduce = 2W)"
    return f"Per MLA layer, {lead}: the all-reduce (`{r0.plan}`) costs {r0.units:g}; " + "; ".join(parts) + "."


def legal_variants(a: Analysis) -> Paragraph:
    """Each legal input-scattered variant's own bytes against today's deployment."""
    ref = a.current
    rows = []
    for name in ("input-scattered+restore", "latent-scattered"):
        v = a.variant(name)
        if v is None or not v.legal or v is ref:
            continue
        b, b0 = v.audit.comm_bytes_per_token, ref.audit.comm_bytes_per_token
        rows.append(f"`{name}` moves {_rel(b, b0)} bytes per token per rank ({b:,.0f} vs {b0:,.0f})")
    if not rows:
        return None
    return "Against today's `" + ref.key + "`: " + "; ".join(rows) + "."


def same_decisions(a: Analysis) -> Paragraph:
    """Plans that make the same decisions as another on this model (e.g. nothing to repair)."""
    if not a.same_as:
        return None
    pairs = "; ".join(f"`{k}` = `{v}`" for k, v in a.same_as.items())
    return (
        f"On this model some plans make the same decisions as another ({pairs}): they share its numbers and its "
        "engine verdict."
    )


def how_sure(a: Analysis) -> Paragraph:
    """The provenance of every predicted time in this memo, and the band that applies."""
    if a.predictor_note:
        return None
    p = a.provenance
    return (
        f"Predicted times here are {p.label} for `{a.topology.name}` "
        f"({a.topology.nodes} x {a.topology.gpus_per_node} GPUs): error band "
        f"±{100 * p.band:.1f}% ({p.basis}). A predicted change inside the band is too close to call."
    )


def one_answer(a: Analysis) -> Paragraph:
    """The search's best, as `tpplan search` names it on the same inputs, and the memo's row for it."""
    if a.search_best is None:
        return None
    name, dep = a.search_best
    v = next((x for x in a.variants if x.plan.name == name and x.deployment == dep), None)
    w = a.first_workload
    t = ttft_mean(v, w) if v is not None and w else None
    over = f"micro-batch overlap `{a.overlap}` ranked too" if a.overlap else "micro-batch overlap off, its default"
    reps = sum(1 for g in a.grid if g[3] > 1)
    grid = f"{len(a.grid) - reps} TP x CP x PP deployments" + (
        f" and {reps} of R replicas of one" if reps else ", one copy of each, replicas only with --replicas"
    )
    return (
        f"**One answer.** `tpplan search` on the same inputs (its grid of {grid}; {over}) ranks `{name}` at "
        f"`{dep}` first" + (f": predicted mean TTFT {fig(t)} s at {w}." if t else ".")
    )


def deployment_ranking(a: Analysis) -> Paragraph:
    """Per workload, the deployments in their ranked order with their mean TTFT, then those over the cap."""
    if not a.deployments:
        return None
    parts = []
    for w, rows in a.deployments.items():
        ranked = ", ".join(f"{r.rank}. `{r.label}` {fig(r.ttft_s or 0.0)} s" for r in rows if r.rank is not None)
        over = [r for r in rows if not r.fits and r.memory_bytes is not None]
        text = f"at `{w}`: {ranked or 'none fits'}"
        if over:
            text += "; over the memory cap: " + ", ".join(
                f"`{r.label}` by {((r.memory_bytes or 0.0) - a.memory_cap_bytes) / GIB:,.1f} GiB" for r in over
            )
        parts.append(text)
    return "**Deployments ranked** (mean TTFT; reasons under Deployments ranked): " + "; ".join(parts) + "."


def prompt_thresholds(a: Analysis) -> Paragraph:
    """From which prompt length CP (per size) beats CP 1, and TP x PP beats TP (the race sentences)."""
    if not a.length_races:
        return None
    cap = a.memory_cap_bytes / GIB if a.memory_cap_bytes != float("inf") else None
    return "**By prompt length** (Prompt length, below): " + " ".join(r.sentence(cap) for r in a.length_races)


def bottom(a: Analysis) -> Paragraph:
    """The computed bottom line: switch or keep, which, and why."""
    return a.bottom.text if a.bottom is not None else None


def kernel_source_disagreement(a: Analysis) -> Paragraph:
    """Where the kernel-price sources disagree beyond their bands, the sentence saying so."""
    return a.kernel_sources.sentence() if a.kernel_sources is not None else None


ANSWER: tuple[Callable[[Analysis], Paragraph], ...] = (
    engine_path,
    question,
    broken_edges,
    gate_quote,
    boundary_units,
    legal_variants,
    same_decisions,
    how_sure,
    one_answer,
    deployment_ranking,
    prompt_thresholds,
    bottom,
    kernel_source_disagreement,
)


def answer(a: Analysis) -> list[str]:
    """The answer's paragraphs that hold for this analysis, in order."""
    return [p for f in ANSWER if (p := f(a)) is not None]


__all__ = ["ANSWER", "answer"]
