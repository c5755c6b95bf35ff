"""The memo's "Serving" section: the deployment(s) chosen under the stated TTFT/TPOT targets, at the stated
statistic, what binds, and the launch lines of each pool with the memory settings the simulation assumed
(`report.serving_memo` computes them). Every sentence is made from the figures it prints beside them
(`chosen_text`).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from tpplan.report.decode_band_section import decode_band_blocks
from tpplan.report.doc import Block, Bullets, Code, Heading, Para, Table
from tpplan.report.rows import fig, rate
from tpplan.search.targets import seconds_text

if TYPE_CHECKING:
    from tpplan.engines.speculative import Speculative
    from tpplan.report.results import Analysis
    from tpplan.search.serving_points import DeploymentAnswer, ServingPoint
    from tpplan.search.targets import Targets
    from tpplan.search.under_targets import TargetsOutcome

SHOWN = 6  # deployments in the section's table


def chosen_text(targets: Targets, a: DeploymentAnswer) -> str:
    """One chosen deployment in a sentence, every figure from its best (or closest) load."""
    p = a.best or a.closest
    load = p.load.describe() + (" per replica" if a.replicas > 1 and p.load.clients is not None else "")
    figs = "; ".join(f"{tg.label} {seconds_text(p.achieved[tg.metric])} (target {seconds_text(tg.seconds)})"
                     for tg in targets.each)  # fmt: skip
    head = "meets the targets" if a.best is not None else "is the closest to the targets, and misses them"
    pools = f" at {a.ratio} (prefill : decode instances)" if a.ratio else ""
    served = (f" (served with `{a.ranked.plan.name}`: the search's best there, `{a.searched}`, is realised by no "
              "engine flag)" if a.searched else "")  # fmt: skip
    return (f"`{a.label}`{pools}{served} {head} at {load}: {figs}; {p.goodput_per_gpu:.3g} good requests/s per GPU, "
            f"{rate(p.output_tok_s_per_gpu)} output tokens/s per GPU, {rate(p.output_tok_s_per_user)} tokens/s per "
            "user. "
            f"What binds: {a.binds or 'nothing at this load'} ({a.why}).{_launched_text(a)}")  # fmt: skip


def _launched_text(a: DeploymentAnswer) -> str:
    """That no engine release launches the deployment, where none does (its launch lines say why)."""
    return " No engine release launches it: needs code (its launch lines say why)." if a.needs_code else ""


def speculative_text(sp: Speculative) -> str:
    """What `--spec` made of the decode steps, from its values, and what the pricing leaves out."""
    from tpplan.engines.speculative import NOT_MODELLED

    return (f"Decode steps are speculative (`--spec`): {sp.method}, {sp.draft_tokens} draft token(s) per step, the "
            f"target verifying {sp.verify_tokens} per request and each request gaining {sp.accepted:g} token(s) per "
            "step (an input, not predicted); every pool's launch lines carry the flags (a P/D prefill server loads and "
            "runs the decode pool's draft). Left out: "
            + "; ".join(NOT_MODELLED) + ".")  # fmt: skip


def serving_section(a: Analysis, command: str, plots: ModuleType, pngs: dict[str, Any]) -> list[Block]:
    """The Serving section, when the memo was asked for targets."""
    s = a.serving
    if s is None:
        return []
    out, wl = s.outcome, s.workload
    how = f"at {out.rate:g} requests/s (Poisson)" if out.rate is not None else f"on the budget of {out.gpus} GPUs"
    prompt = wl.input_len if wl.input_len is not None else max(wl.input_lens or [0])
    b: list[Block] = [
        Heading("Serving"),
        Para(
            f"Each deployment of the search served with decode {how} under {out.targets.describe()}: workload "
            f"`{wl.name}`, {prompt:,}-token prompts and {wl.output_len:,} output tokens, steps of {wl.chunk_size:,} "
            "tokens, requests admitted as the engine admits them (its running-request cap and KV pool), P/D pools "
            "beside the aggregated deployments; ranked by goodput per GPU (requests meeting both targets by their "
            "own TTFT and TPOT, per second, per GPU). " + out.verdict()
        ),
    ]
    if out.speculative is not None:
        b.append(Para(speculative_text(out.speculative)))
    b.append(Bullets(tuple(chosen_text(out.targets, x) for x in s.chosen())))
    b.append(_table(out))
    if s.decode_band is not None:
        b += decode_band_blocks(s.decode_band[1], s.decode_band[0])
    for x in s.chosen():
        lines = [ln for ln in s.launches if ln.deployment == x.label]
        if not lines:
            continue
        b.append(Para(f"Launch lines for `{x.label}` (each pool, both engines; memory settings as the engine "
                      "derives them, the step budget the loop ran, the running cap that holds the load):"))  # fmt: skip
        for ln in lines:
            what = (
                f"{ln.pool} pool, {ln.instances} server(s)" if ln.pool != "aggregated" else f"{ln.instances} replica(s)"
            )
            if ln.command:
                b.append(Para(f"{ln.engine}, {what}: {ln.memory}"))
                b.append(Code(ln.command, "bash"))
            else:
                b.append(Para(f"{ln.engine}, {what}: needs code ({ln.why_not})."))
    b.append(Para("Flags read from: " + "; ".join(s.sources) + "."))
    return b


def _table(out: TargetsOutcome) -> Table:
    heads = ["deployment", "load"] + [f"{tg.label} ms" for tg in out.targets.each]
    rows = []
    for x in out.answers[:SHOWN]:
        p: ServingPoint = x.best or x.closest
        label = f"`{x.label}`" + (" (needs code)" if x.needs_code else "")
        rows.append((label, p.load.describe(), *(fig(p.achieved[tg.metric] * 1e3) for tg in out.targets.each),
                     f"{p.goodput_per_gpu:.3g}", rate(p.output_tok_s_per_gpu), rate(p.output_tok_s_per_user),
                     "yes" if x.best is not None else "no", x.binds or "-"))  # fmt: skip
    heads += ["goodput/GPU", "tok/s/GPU", "tok/s/user", "meets", "binds"]
    n = len(heads)
    return Table(tuple(heads), tuple(rows), tuple(range(2, n - 2)))


__all__ = ["SHOWN", "chosen_text", "serving_section", "speculative_text"]
