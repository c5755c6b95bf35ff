"""A plan file's decisions checked against the model they are applied to (issue 35).

The propagation (`tpplan.layout.propagate`) matches a plan's decisions by name and passes over a name
that matches nothing, so a file naming an op that does not exist (`"abc"`, `""`, `"P"`), an op where
the decision means nothing (`replicate` of an op without a weight), or a pattern that matches more
than meant (`"gather": ["*"]`, which also all-gathers K3's attention-residual bank) changed the plan
silently; the last was called legal by the audit and computed wrong values. A file therefore names
every op exactly (`<layer kind>/<role>`), each where its decision acts, and no two decisions
contradict each other; anything else is exit 2 naming the field, the reason and the fix.

Named plans keep their patterns (they are code, tested by execution); `exact_decisions` expands them
into the exact names a file stores.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpplan.errors import TpplanError, shown
from tpplan.layout.plan import Plan
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.models.opkinds import op_kind
from tpplan.models.ops import Op

PATTERN_CHARS = "*?["
EXTERNAL_PRODUCERS = ("resid", "delta")  # the layer's inputs a decision may convert (the bank: `bank` places it)
BANK = "layer.bank"


@dataclass(frozen=True)
class _Field:
    """One decision list: which names it may hold, in words for the error."""

    name: str
    accepts: Callable[[LayerGraph, str], bool]
    what: str


def _ops(lg: LayerGraph) -> dict[str, Op]:
    return {op.role: op for op in lg.ops}


def producers(lg: LayerGraph) -> list[str]:
    """Roles whose output a gather or all-to-all may convert: every op, and the layer's own inputs."""
    return [op.role for op in lg.ops] + [f"layer.{v}" for v in EXTERNAL_PRODUCERS if v in lg.values]


def _is_producer(lg: LayerGraph, role: str) -> bool:
    return role in producers(lg)


def _has_weight(lg: LayerGraph, role: str) -> bool:
    op = _ops(lg).get(role)
    return op is not None and op_kind(op.kind).replicable


def _is_op(lg: LayerGraph, role: str) -> bool:
    return role in _ops(lg)


def _folds(lg: LayerGraph, role: str) -> bool:
    op = _ops(lg).get(role)
    return op is not None and op.reduces_into_stream


FIELDS = {
    "gather": _Field(
        "gather", _is_producer, "an op or layer input (layer.resid, layer.delta) whose output it all-gathers"
    ),
    "a2a": _Field("a2a", _is_producer, "an op or layer input whose token-sharded output it moves to head-sharded"),
    "replicate": _Field("replicate", _has_weight, "an op with a weight (a linear layer or router)"),
    "token_shard": _Field("token_shard", _is_op, "an op"),
    "fold": _Field("fold", _folds, "a residual add (layer.attn_add, layer.mlp_add) or block-output norm"),
}


def names_for(graph: ModelGraph, field: str) -> list[str]:
    """Every exact name `decisions.<field>` may hold on `graph` (gather_for: see `gather_for_pairs`)."""
    return _candidates(graph, FIELDS[field])


def gather_for_pairs(graph: ModelGraph) -> list[tuple[str, str]]:
    """Every (producer, consumer) pair `decisions.gather_for` may hold: the consumer reads the output."""
    return [
        (f"{k}/{p}", f"{k}/{op.role}")
        for k, lg in graph.kinds.items()
        for op in lg.ops
        for p in producers(lg)
        if _reads(lg, p, op)
    ]


def _candidates(graph: ModelGraph, field: _Field) -> list[str]:
    return [f"{k}/{role}" for k, lg in graph.kinds.items() for role in _all_roles(lg) if field.accepts(lg, role)]


def _all_roles(lg: LayerGraph) -> list[str]:
    return list(dict.fromkeys([*producers(lg), *(op.role for op in lg.ops)]))


def _suggest(name: str, known: list[str]) -> str:
    """`did you mean X?` for the closest known names (difflib), else a few of them."""
    bare = name.rpartition("/")[2]
    close = [k for k in known if k.rpartition("/")[2] == bare][:3] or difflib.get_close_matches(name, known, n=3)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    some = ", ".join(known[:4]) + (" ..." if len(known) > 4 else "")
    return f"name one of {some} (the plan files `tpplan search --save DIR` writes name every op exactly)"


def check_decisions(plan: Plan, graph: ModelGraph, found_kinds: Iterable[str], where: str) -> None:
    """Refuse (TpplanError naming `decisions.<field>[i]`) a name that is a pattern, not a qualified op of
    this model, or where its decision has no effect; and decisions that contradict each other.
    Names of a layer kind the file was found for but this model lacks (the bench's slice) are skipped."""
    found = set(found_kinds)
    known = {name: _candidates(graph, field) for name, field in FIELDS.items()}
    lists = {
        "gather": sorted(plan.gather),
        "a2a": sorted(plan.a2a),
        "replicate": sorted(plan.replicate),
        "token_shard": sorted(plan.token_shard),
        "fold": sorted(plan.fold),
    }
    for name, values in lists.items():
        for i, q in enumerate(values):
            _check_name(q, FIELDS[name], graph, found, known[name], f"{where}: decisions.{name}[{i}]")
    for i, (p, c) in enumerate(sorted(plan.gather_for)):
        at = f"{where}: decisions.gather_for[{i}]"
        _check_name(p, FIELDS["gather"], graph, found, known["gather"], at)
        _check_name(c, FIELDS["token_shard"], graph, found, known["token_shard"], at)
        _check_consumes(p, c, graph, at)
    _check_contradictions(plan, graph, where)


def _check_name(q: str, field: _Field, graph: ModelGraph, found: set[str], known: list[str], at: str) -> None:
    if q in known:
        return
    if any(c in q for c in PATTERN_CHARS):
        matches = [k for k in known if Plan("", "", "", gather=frozenset({q})).gathers(k)]
        listed = ", ".join(matches[:3]) + (" ..." if len(matches) > 3 else "")
        fix = f"list the {len(matches)} op(s) it matches one by one ({listed})" if matches else _suggest(q, known)
        raise TpplanError(at, f"{shown(q)} is a pattern; a plan file names every op exactly", fix)
    kind, slash, role = q.partition("/")
    if not slash:
        raise TpplanError(at, f"{shown(q)} is not a qualified op name `<layer kind>/<role>`", _suggest(q, known))
    lg = graph.kinds.get(kind)
    if lg is None:
        if kind in found:
            return  # a kind of the model the file was found for that this one (a slice) lacks
        raise TpplanError(at, f"{shown(q)} names layer kind {shown(kind)}, which model {graph.spec.name} does not have "
                          f"(layer kinds {', '.join(graph.kinds)})", _suggest(q, known))  # fmt: skip
    if role == BANK and field.name in ("gather", "a2a"):
        raise TpplanError(at, f"{shown(q)} moves K3's attention-residual bank, whose placement decisions.bank sets",
                          'drop it, and set decisions.bank to "R" for a bank on every row')  # fmt: skip
    if not field.accepts(lg, role):
        exists = role in _all_roles(lg)
        reason = (f"{shown(q)} is not {field.what}" if exists
                  else f"{shown(q)}: model {graph.spec.name} has no op {shown(role)} in layer kind {kind}")  # fmt: skip
        raise TpplanError(at, reason, _suggest(q, known) if not exists else f"drop it from decisions.{field.name}")


def _check_consumes(p: str, c: str, graph: ModelGraph, at: str) -> None:
    pk, _, prole = p.partition("/")
    ck, _, crole = c.partition("/")
    lg = graph.kinds.get(ck)
    if lg is None or graph.kinds.get(pk) is None:
        return
    ops = _ops(lg)
    value = ops[prole].output if prole in ops else prole.removeprefix("layer.")
    if pk != ck or value not in ops[crole].inputs:
        raise TpplanError(at, f"{shown(c)} does not read the output of {shown(p)}, so the gather would never happen",
                          f"pair {shown(p)} with an op that reads it, or drop the pair")  # fmt: skip


def _check_contradictions(plan: Plan, graph: ModelGraph, where: str) -> None:
    both = sorted(plan.gather & plan.a2a)
    if both:
        raise TpplanError(f"{where}: decisions.a2a", f"{shown(both[0])} is in both gather and a2a: all-gathered to "
                          "every row and moved to head-sharded at once", "keep it in one of the two")  # fmt: skip
    if plan.bank is not None and not graph.spec.attn_res_block_size:
        raise TpplanError(f"{where}: decisions.bank", f"model {graph.spec.name} has no attention-residual bank",
                          "drop decisions.bank (it is K3's)")  # fmt: skip


def exact_decisions(plan: Plan, graph: ModelGraph) -> Plan:
    """`plan` with every pattern and bare role expanded into the exact qualified names it matches on
    `graph` (what a plan file stores); names that match nothing are dropped, as the propagation does."""

    def exact(field: str, matches: Callable[[str], bool]) -> frozenset[str]:
        return frozenset(q for q in _candidates(graph, FIELDS[field]) if matches(q))

    pairs = frozenset(pair for pair in gather_for_pairs(graph) if plan.gathers_for(*pair))
    return plan.with_(
        gather=exact("gather", plan.gathers),
        a2a=exact("a2a", plan.a2a_of),
        replicate=exact("replicate", plan.replicates),
        token_shard=exact("token_shard", plan.shards_tokens),
        fold=exact("fold", plan.folds),
        gather_for=pairs,
    )


def _reads(lg: LayerGraph, producer: str, op: Op) -> bool:
    ops = _ops(lg)
    value = ops[producer].output if producer in ops else producer.removeprefix("layer.")
    return value in op.inputs


__all__ = ["check_decisions", "exact_decisions", "gather_for_pairs", "names_for", "producers"]
