"""The memo's decision rules: a verdict per plan, the ranked next steps and the bottom line.

Every plan is judged against today's deployment (`--current`, default baseline) on the first
workload's predicted mean TTFT, with the error band of the prediction's provenance
(`tpplan/cost/provenance.py`): a gain or loss inside the band is "too close to call". A plan that is illegal
or does not fit in GPU memory is never a YES. The rules are written out in docs/report.md.
"""

from __future__ import annotations

from tpplan.cost.provenance import Provenance, within_band
from tpplan.engines.recipes import EngineRecipe
from tpplan.report.results import BottomLine, NextStep, Variant, Verdict, held_weights, memory_fit, ttft_mean
from tpplan.units import gib, pct_change


def engine_ok(e: EngineRecipe | None) -> bool:
    """An engine runs the plan as is: its flags realise it and no static condition stops them."""
    return e is not None and e.realises == "yes" and not e.blocked


def engine_refusal(e: EngineRecipe) -> str | None:
    """What the engine does with the flag when one of its conditions fails, plainly (the effect is
    the engine data's: tpplan.engines)."""
    failed = [c for c in e.conditions if c.met is False and c.effect in ("refuses", "runs baseline", "asserts")]
    if not failed:
        return None
    what = "; ".join(c.text for c in failed)
    if any(c.effect == "refuses" for c in failed):
        return f"{e.engine} would refuse the flags: {what}"
    if any(c.effect == "asserts" for c in failed):
        return f"{e.engine} would start and stop on an assertion: {what}"
    return f"{e.engine} would accept the flags and run the all-reduce path instead: {what}"


def deciding_engine(engines: list[EngineRecipe]) -> EngineRecipe | None:
    """The engine a verdict cites: the first whose flags run the plan as is (the memo's deployed engine first:
    the first --engine's, else SGLang), else SGLang's recipe (its refusal or summary is the reason); verdicts
    judge both engines."""
    return next((e for e in engines if engine_ok(e)), None) or next(
        (e for e in engines if e.engine == "SGLang"), engines[0] if engines else None
    )


def no_engine(v: Variant) -> str:
    """Why no engine runs the plan at its deployment as is, engine by engine."""
    return "; ".join(
        f"{x.engine}: " + (f"only partly ({x.summary})" if x.realises == "partly" else engine_refusal(x) or x.summary)
        for x in v.engines
    )


def conditions(v: Variant) -> tuple[str, ...]:
    """What must hold for the plan to run as predicted, in words: an engine that runs it at its deployment
    when none does (each engine's reason), else the conditions of the engine that runs it that tpplan did
    not check. Replicated weights are a price, stated apart."""
    e = deciding_engine(v.engines)
    if e is None or not engine_ok(e):
        return (f"an engine that runs it at {v.deployment} (none does as is: {no_engine(v)})",)
    out: list[str] = []
    for c in e.conditions:
        if c.effect not in ("refuses", "skips silently") or c.met is True:
            continue
        state = "fails here; " if c.met is False else "" if "not checked" in c.text else "not checked; "
        out.append(f"{e.engine}: {c.text} ({state}if not, {e.engine} {c.effect})")
    return tuple(out)


def judge(
    v: Variant,
    ref: Variant,
    formula: str,
    wl: str | None,
    band: Provenance,
    same_as: str | None = None,
    gpu_bytes: float = 0.0,
    shape_base: Variant | None = None,
) -> Verdict:
    """One plan's verdict against today's deployment `ref` (`gpu_bytes`: the memory limit per rank,
    the memo's --memory-cap, also for the weights-only check when there is no memory prediction).
    When `v` runs at another TP x PP than `ref`, `shape_base` (baseline at `v`'s shape) splits the
    change into the deployment's and the plan's."""

    vol = pct_change(v.audit.comm_bytes_per_token, ref.audit.comm_bytes_per_token)
    if v is ref:
        return _reference_verdict(v, formula, gpu_bytes)
    if not v.legal:
        roots = [viol.sentence() for viol in v.audit.violations if not viol.consequence_of]
        ops = sorted({viol.op for viol in v.audit.violations if not viol.consequence_of})
        head = f"illegal: {len(roots)} root edge(s) ({', '.join(ops)}); its {vol:+.1f}% volume is not reachable"
        return Verdict(v.key, "NO", head, tuple(roots), formula)
    t_v = ttft_mean(v, wl) if wl else None
    t_r = ttft_mean(ref, wl) if wl else None
    head = f"legal; {vol:+.1f}% bytes per token per rank vs `{ref.key}`"
    if t_v is not None and t_r is not None:
        head += _ttft_change(v, ref, shape_base, wl, band, t_v, t_r)
    elif v.prediction_error:
        head += f"; not predicted ({v.prediction_error})"
    extra = held_weights(v)[1]
    reasons = _reasons(v, same_as, extra)
    over = _over_memory(v, gpu_bytes)
    if over is not None:
        reasons.insert(0, over[0])
        return Verdict(v.key, "NO", head + " (does not fit in GPU memory)", tuple(reasons), formula)
    if t_v is not None and t_r is not None:
        gain = (t_r - t_v) / t_r
        if within_band(gain, band.band):
            return Verdict(v.key, "TOO CLOSE", head + " (inside the band: too close to call)", tuple(reasons), formula)
        if gain < 0:
            return Verdict(v.key, "NO", head + " (slower)", tuple(reasons), formula)
    elif v.shape != ref.shape:
        head = (
            f"collectives per rank change with the shape ({v.audit.comm_bytes_per_token:,.0f} vs "
            f"{ref.audit.comm_bytes_per_token:,.0f} bytes per token per rank); bubble and stage sends need the "
            "time predictor"
        )
        return Verdict(v.key, "OPEN", head, tuple(reasons), formula)
    elif vol > 0:
        return Verdict(v.key, "NO", head + " (more bytes, no time prediction)", tuple(reasons), formula)
    elif vol == 0:
        return Verdict(v.key, "OPEN", head + " (same traffic: only time can tell)", tuple(reasons), formula)
    conds = conditions(v)
    status = "CONDITIONAL" if conds or extra else "YES"
    if conds:
        reasons.append("conditions: " + "; ".join(conds))
    return Verdict(v.key, status, head, tuple(reasons), formula)


def _reference_verdict(v: Variant, formula: str, gpu_bytes: float) -> Verdict:
    """Today's deployment: the reference, with a note where it does not fit the memory limit itself."""
    over = _over_memory(v, gpu_bytes)
    note = (f"{over[0]}: {over[1]}",) if over is not None else ()
    return Verdict(
        v.key, "reference", "today's deployment (--current): every other plan is judged against it", note, formula
    )


def _over_memory(v: Variant, gpu_bytes: float) -> tuple[str, str] | None:
    """(why `v` does not fit the memory limit per rank, what would make it fit), or None where it fits: its
    predicted memory, or without a prediction its weights alone."""
    fit = memory_fit(v, gpu_bytes)
    if fit is not None and not fit[2]:
        return f"predicted memory {gib(fit[0])} per rank exceeds the limit of {gib(fit[1])}", (
            "lower --expert-dtype, or raise --memory-cap"
        )
    weights = held_weights(v)[0]
    if fit is None and gpu_bytes and weights > gpu_bytes:
        why = f"weights alone take {gib(weights)} per rank, more than the limit of {gib(gpu_bytes)}"
        return why, "raise TP or lower the weight dtype"
    return None


def _ttft_change(
    v: Variant, ref: Variant, shape_base: Variant | None, wl: str | None, band: Provenance, t_v: float, t_r: float
) -> str:
    """The predicted TTFT against the reference's with the band; at another shape, split into the
    deployment's change (baseline at `v`'s shape) and the plan's."""
    text = (
        f"; predicted mean TTFT ({wl}) {t_v:.3f} s vs {t_r:.3f} s ({pct_change(t_v, t_r):+.1f}%; "
        f"band ±{100 * band.band:.1f}%, {band.label})"
    )
    t_s = ttft_mean(shape_base, wl) if wl and shape_base is not None and shape_base is not v else None
    if t_s is not None and shape_base is not None and v.shape != ref.shape:
        text += (
            f"; of which the deployment change (`{shape_base.key}` vs `{ref.key}`) {pct_change(t_s, t_r):+.1f}% "
            f"and the plan at the same shape (vs `{shape_base.key}`) {pct_change(t_v, t_s):+.1f}%"
        )
    return text


def _reasons(v: Variant, same_as: str | None, extra: float) -> list[str]:
    """The reasons every legal plan's verdict lists: an identical plan, replicated weights, and why the
    deciding engine does not run it."""
    reasons: list[str] = []
    if same_as:
        reasons.append(f"same decisions as `{same_as}` on this model: same numbers, same engine verdict")
    if extra:
        reasons.append(f"replicates weights: +{gib(extra)} per rank")
    sgl = deciding_engine(v.engines)
    refusal = engine_refusal(sgl) if sgl is not None and not engine_ok(sgl) else None
    if refusal:
        reasons.append(refusal)
    elif sgl is not None and sgl.realises == "no":
        reasons.append(f"no engine flag realises it: {sgl.summary}")
    return reasons


def switch_price(v: Variant, ref: Variant) -> str:
    """What a switch from `ref` to `v` costs per rank: its predicted memory against today's and the card's
    capacity, with its parts (weights, replicated weights among them, KV cache for the workload's tokens,
    recurrent state, activations), the KV pool the deciding engine sizes and the decode batch it admits
    (`kv_room`; without one, the GiB left on the card), and the GPUs it takes.
    Without a memory prediction: the replicated weights the audit counts."""
    p, q = next(iter(v.predictions.values()), None), next(iter(ref.predictions.values()), None)
    m, m0 = getattr(p, "memory", None), getattr(q, "memory", None)
    card = float(getattr(p, "gpu_memory_bytes", 0.0) or 0.0)
    if m is None or m0 is None or not card:
        extra = held_weights(v)[1]
        return (
            f"+{gib(extra)} of replicated weights per rank" if extra else "no replicated weights (memory not predicted)"
        )
    parts = [
        f"weights {gib(m.weights)}" + (f", {gib(m.replicated_extra)} of them replicated" if m.replicated_extra else "")
    ]
    parts.append(f"KV cache {gib(m.kv_cache)} for the workload's tokens")
    if m.recurrent_state:
        parts.append(f"recurrent state {gib(m.recurrent_state)}")
    parts.append(f"activations {gib(m.activations)}")
    text = f"memory per rank {gib(m0.total)} -> {gib(m.total)} of the card's {gib(card)} ({'; '.join(parts)})"
    room = kv_room(v, ref)
    left, left0 = gib(card - m.total), gib(card - m0.total)
    text += f"; {room}" if room else f", leaving {left} for more KV blocks and the engine's buffers ({left0} today)"
    gpus, gpus0 = v.parallel.gpus, ref.parallel.gpus
    if gpus != gpus0:
        text += f"; {gpus} GPUs instead of {gpus0}"
    return text


def kv_room(v: Variant, ref: Variant) -> str | None:
    """The KV pool the deciding engine sizes at its defaults for `v` against `ref` (`PlanPrediction.kv_capacity`,
    `tpplan.cost.kv_capacity`): tokens per rank and the decode batch it admits at the workload's longest
    request. None when the predictions carry no capacity for that engine."""
    e = deciding_engine(v.engines)
    p, q = next(iter(v.predictions.values()), None), next(iter(ref.predictions.values()), None)
    caps, caps0 = getattr(p, "kv_capacity", ()), getattr(q, "kv_capacity", ())
    name = e.engine.lower() if e is not None else "sglang"
    c = next((x for x in caps if x.engine.startswith(f"{name}@")), caps[0] if caps else None)
    c0 = next((x for x in caps0 if c is not None and x.engine == c.engine), None)
    if c is None or c0 is None:
        return None
    text = f"{c.label} at its defaults sizes the KV pool to {c.tokens:,} tokens per rank ({c0.tokens:,} today)"
    if c.batch is not None and c0.batch is not None:
        text += (
            f", a decode batch of {c.batch:,} requests of {c.seq_len:,} tokens ({c0.batch:,} today; bound by {c.bound})"
        )
    return text


def next_steps(
    variants: list[Variant], ref: Variant, wl: str | None, band: Provenance, gpu_bytes: float = 0.0
) -> list[NextStep]:
    """Legal plans that fit and beat today's deployment, ranked by predicted TTFT gain (by bytes
    saved when there is no time prediction; other parallel shapes are then left out)."""

    steps: list[NextStep] = []
    t_r = ttft_mean(ref, wl) if wl else None
    for v in variants:
        if v is ref or not v.legal:
            continue
        fit = memory_fit(v, gpu_bytes)
        if fit is not None and not fit[2]:
            continue
        if fit is None and gpu_bytes and held_weights(v)[0] > gpu_bytes:
            continue
        t_v = ttft_mean(v, wl) if wl else None
        if t_v is not None and t_r is not None:
            gain, rel, basis = t_r - t_v, (t_r - t_v) / t_r, f"predicted mean TTFT gain at {wl}"
        elif v.shape != ref.shape or t_r is not None:
            continue  # another shape, or not predicted while today's is: bytes are not comparable
        else:
            b0 = ref.audit.comm_bytes_per_token
            gain = rel = (b0 - v.audit.comm_bytes_per_token) / b0 if b0 else 0.0
            basis = "communication bytes saved (no time prediction)"
        if gain <= 0:
            continue
        extra = held_weights(v)[1]
        price = switch_price(v, ref)
        sgl = deciding_engine(v.engines)
        ok = engine_ok(sgl)
        engine = sgl.line() if ok and sgl else f"needs code: no engine runs it as is ({no_engine(v)})"
        clear = "TTFT" in basis and not within_band(rel, band.band)
        conds = conditions(v) if ok else ()
        if ok and wl and (p := v.predictions.get(wl)) is not None:  # what the serving loop does not model
            conds += tuple(getattr(p, "serving_conditions", ()))
        if extra:  # CONDITIONAL on its replication too: say so in the bottom line
            conds += (f"the engine replicates those weights (+{gib(extra)} per rank, in the predicted memory)",)
        steps.append(NextStep(v.key, gain, rel, basis, price, engine, ok, clear, conds))
    return sorted(steps, key=lambda s: -s.gain)


def bottom_line(steps: list[NextStep], ref: Variant, wl: str | None, band: Provenance) -> BottomLine:
    """Switch to the best next step an engine runs when its predicted gain exceeds the error band, else keep;
    a faster step that needs code is named after it, never recommended."""

    cur = f"`{ref.key}`"
    band_txt = f"±{100 * band.band:.1f}% error band of predictions {band.label}"
    if not steps:
        return BottomLine("keep", ref.key, f"**Keep {cur}**: no legal plan that fits in memory beats it.")
    top = steps[0]
    if not top.timed:
        return BottomLine(
            "keep",
            ref.key,
            f"**Keep {cur} until plans are timed**: `{top.key}` moves {100 * top.gain:.1f}% fewer bytes per token "
            "per rank, but without a time prediction bytes alone do not decide.",
        )
    t_r = ttft_mean(ref, wl) if wl else None

    def numbers(s: NextStep) -> str:
        return f"predicted mean TTFT at {wl} {(t_r or 0.0) - s.gain:.3f} s vs {t_r:.3f} s (-{100 * s.rel:.1f}%)"

    run = next((s for s in steps if s.engine_ok), None)
    needs = "" if top.engine_ok else (
        f" The fastest predicted, `{top.key}` ({numbers(top)}, {'beyond' if top.clear else 'inside'} the band), "
        f"{top.engine}."
    )  # fmt: skip
    if run is None or not run.clear:
        close = (
            f"the best step an engine runs, `{run.key}`, is {numbers(run)}, inside the {band_txt}: too close to call; "
            "measure it before switching."
            if run is not None
            else "no step an engine runs beats it."
        )
        return BottomLine("keep", ref.key, f"**Keep {cur}**: {close}{needs}")
    text = f"**Switch from {cur} to `{run.key}`**: {numbers(run)}, beyond the {band_txt}; price: {run.price}."
    if run.conditions:
        text = text.replace("**Switch from", "**Switch, if its conditions hold, from", 1)
        text += " Conditions: " + "; ".join(f"({i}) {c}" for i, c in enumerate(run.conditions, 1)) + "."
    text += f" Launch: {run.engine}; Engine flags below lists the conditions it needs.{needs}"
    return BottomLine("switch", run.key, text)


__all__ = ["bottom_line", "engine_ok", "judge", "next_steps"]
