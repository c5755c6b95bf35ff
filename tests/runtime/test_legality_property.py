"""The audit never calls a wrong plan legal (issue 35): random decision sets on the tiny presets, each
one a plan file could hold (`tpplan.plans.decisions.check_decisions` accepts it); every one the audit
calls legal at TP2 runs sharded on gloo and equals the single-process forward, with the traced
collectives equal to the predicted ones.

Hypothesis draws the decision sets (derandomized: the same ones on every run); the legal ones are then
verified together in one two-rank group, because forming the group is the expensive part. The quick
lane explores `QUICK` sets (about 20 s on 2 busy cores, most of it starting the ranks); the slow lane
`MANY`.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpplan.audit import audit, audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import ModelGraph, build_model_graph
from tpplan.placement import S_TOK, R
from tpplan.plans.decisions import check_decisions, exact_decisions, gather_for_pairs, names_for
from tpplan.plans.named import ALL_PLANS, make_plan
from tpplan.runtime.verify import CaseResult, VerifyCase, verify_cases

N = 2
TINY = tuple(p for p in list_presets() if p.startswith("tiny-"))
QUICK, MANY = 60, 600
SETS = ("gather", "a2a", "replicate", "token_shard")


@cache
def graph(model: str) -> ModelGraph:
    return build_model_graph(load_model(model))


@cache
def legal_bases(model: str) -> tuple[str, ...]:
    """The named plans legal for `model` at TP2: starting points that are near legal plans."""
    return tuple(pa.plan.name for pa in audit(model, N, list(ALL_PLANS)).plans if pa.legal)


@st.composite
def plans(draw: st.DrawFn) -> tuple[str, Plan]:
    """A model and a plan: a legal named plan's exact decisions with a few names dropped and added,
    the stream, reduce target and MoE mode redrawn."""
    model = draw(st.sampled_from(TINY))
    g = graph(model)
    base = exact_decisions(make_plan(draw(st.sampled_from(legal_bases(model))), g, N), g)
    changes: dict[str, object] = {}
    for field in SETS:
        now = sorted(getattr(base, field))
        drop = draw(st.sets(st.sampled_from(now), max_size=2)) if now else set()
        add = draw(st.sets(st.sampled_from(names_for(g, field)), max_size=2))
        changes[field] = (frozenset(now) - drop) | add
    pairs = gather_for_pairs(g)
    changes["gather_for"] = base.gather_for | draw(st.sets(st.sampled_from(pairs), max_size=1))
    changes["stream"] = draw(st.sampled_from([base.stream, R, S_TOK]))
    changes["reduce"] = draw(st.sampled_from([base.reduce, R, S_TOK]))
    if any(lg.values.get("routing") for lg in g.kinds.values()) and base.overlap is None:
        moe = draw(st.sampled_from([base.moe, "tp", "ep", "a2a"]))
        changes.update(moe=moe, ep_size=N if moe == "ep" else None)
    return model, base.with_(name="random", found_by="search", **changes)


def legal_random_plans(examples: int) -> list[tuple[str, Plan]]:
    """The distinct plans, among `examples` drawn, that a plan file may hold and the audit calls legal."""
    found: dict[tuple[str, Plan], None] = {}

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(plans())
    def explore(drawn: tuple[str, Plan]) -> None:
        model, plan = drawn
        try:
            check_decisions(plan, graph(model), (), "random plan")
        except TpplanError:
            return  # refused at the file's edge: never reaches the audit
        if audit_plan(graph(model), plan, N, "fp32").legal:
            found[(model, plan)] = None

    explore()
    return list(found)


def _why(r: CaseResult, plan: Plan) -> str:
    first = next((e for e in r.errors if e.rel > r.tolerance), None)
    where = f"chunk {first.chunk} layer {first.layer} {first.value} rel {first.rel:.2e}" if first else "values ok"
    return f"{r.case.model}: {plan.describe()} -> {where}, trace matches {r.trace_matches}"


def check_legal_plans_verify(examples: int, at_least: int) -> None:
    found = legal_random_plans(examples)
    assert len(found) >= at_least, f"only {len(found)} legal plans among {examples} drawn"
    found.sort(key=lambda mp: mp[0])  # one reference forward per model
    cases = [VerifyCase(m, f"random-{i}", tokens=6, chunk=5, plan_obj=p.with_(name=f"random-{i}"))
             for i, (m, p) in enumerate(found)]  # fmt: skip
    results = verify_cases(cases, nproc=N, timeout_s=300)
    assert len(results) == len(cases)
    bad = [_why(r, p) for r, (_, p) in zip(results, found, strict=True) if not r.passed]
    assert not bad, "the audit called these plans legal, but they ran wrong:\n" + "\n".join(bad)


def test_every_plan_the_audit_calls_legal_verifies() -> None:
    check_legal_plans_verify(QUICK, at_least=8)


@pytest.mark.slow
def test_every_plan_the_audit_calls_legal_verifies_many() -> None:
    check_legal_plans_verify(MANY, at_least=60)
