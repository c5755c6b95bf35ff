"""A plan: the placement decisions for a whole model, applied layer by layer.

A plan does not list collectives one by one. It states a few decisions, and the propagation
(`tpplan.layout.propagate`) derives every collective from them and from the op rules:

- `stream`: where the residual stream lives between blocks (R, or token-sharded S(tok)). Block
  outputs are partial sums and are reduced into it: all-reduce for R, reduce-scatter for S(tok).
- `reduce`: the target when a partial sum meets a non-linear op elsewhere (e.g. K3's latent norm).
- `gather`: producers whose output is all-gathered to R before any consumer sees it
  (e.g. `mla.qkv_a`: SGLang's QKV latent all-gather).
- `gather_for`: (producer, consumer) pairs gathered for that consumer only.
- `a2a`: producers whose token-sharded output is moved to head-sharded by an all-to-all.
- `replicate`: ops whose weight every rank holds whole (a memory price, reported).
- `token_shard`: replicated ops that run on the rank's own tokens (a free slice of R).
- `fold`: residual adds (`layer.attn_add` / `layer.mlp_add`) that fold the stream's token shard
  into the block output's partial sum (each rank writes its own rows, zeros elsewhere) and
  all-reduce that sum over every row: the stream leaves the add replicated. One all-reduce replaces
  the reduce-scatter, the token-sharded add and an all-gather (SGLang's input-scattered MLP side,
  `_tp_all_reduce_with_scattered_residual`; docs/engines.md).
- `moe`: routed experts under tensor parallelism `tp`, expert parallelism without all-to-all
  `ep` (each rank holds E/ep experts, each split over N/ep ranks), or all-to-all dispatch `a2a`.
- `bank`: where K3's attention-residual bank of block snapshots lives (None: with the stream). R under
  an S(tok) stream is SGLang's default K3 SP-MoE: every rank writes every row of the bank, the
  attention-side aggregation reads all of it, the MLP-side one its own rows (a free slice).
- `dp_attention`: data-parallel attention (`tpplan.layout.dp_attention`): each rank's token-sharded
  rows are whole requests of its own, so token mixers run on them; the value names how the engine
  gathers and scatters around the MLP/MoE (`max_len`: all-gather / reduce-scatter of buffers
  padded to the longest rank; `sum_len`: all-reduce of a zero-filled buffer of every rank's rows).

Every op and producer is matched by a pattern against its qualified role
`<layer kind>/<role>`, e.g. `mla+moe/mla.g_proj`; `*/mla.g_proj` matches it in every layer kind.
Only collectives that follow from these decisions are issued; an edge that would need any
other collective is illegal, and the audit says which and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Literal

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.placement import S_TOK, Placement, R

MoEMode = Literal["tp", "ep", "a2a"]
DpPadding = Literal["max_len", "sum_len"]
OverlapName = Literal["tbo", "dbo", "asynctp"]  # micro-batch overlaps (engines.overlap), GEMM fusion (engines.async_tp)


def _match(patterns: Iterable[str], qualified: str) -> bool:
    if not patterns:
        return False
    qual, bare_exact, wild = _split(patterns if isinstance(patterns, frozenset) else frozenset(patterns))
    if qualified in qual:  # exact qualified names (what the search generates): one lookup
        return True
    if not bare_exact and not wild:
        return False
    bare = qualified.split("/", 1)[1]
    if bare in bare_exact:
        return True
    return any(fnmatchcase(qualified, p) or fnmatchcase(bare, p) for p in wild)


@lru_cache(maxsize=4096)
def _split(patterns: frozenset[str]) -> tuple[frozenset[str], frozenset[str], tuple[str, ...]]:
    """(exact qualified names, exact bare roles, wildcard patterns)."""
    wild = tuple(p for p in patterns if any(c in p for c in "*?["))
    exact = patterns.difference(wild)
    bare = frozenset(p for p in exact if "/" not in p)
    return exact - bare, bare, wild


@lru_cache(maxsize=4096)
def _inexact_pairs(pairs: frozenset[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The pairs an exact (qualified producer, qualified consumer) lookup does not settle: those
    with a wildcard or a bare role on either side (the search generates only exact pairs)."""
    return tuple((p, c) for p, c in pairs if any(ch in p + c for ch in "*?[") or "/" not in p or "/" not in c)


@dataclass(frozen=True)
class Plan:
    name: str
    title: str
    summary: str
    stream: Placement = R
    reduce: Placement = R
    gather: frozenset[str] = frozenset()
    gather_for: frozenset[tuple[str, str]] = frozenset()
    a2a: frozenset[str] = frozenset()
    replicate: frozenset[str] = frozenset()
    token_shard: frozenset[str] = frozenset()
    fold: frozenset[str] = frozenset()
    moe: MoEMode = "tp"
    ep_size: int | None = None
    # redundant copies of routed experts beside the logical ones (SGLang --ep-num-redundant-experts, vLLM EPLB's
    # num_redundant_experts): the EP group holds experts + redundant_experts physical experts, an equal share each
    redundant_experts: int = 0
    dp_attention: DpPadding | None = None
    bank: Placement | None = None  # where K3's attention-residual bank lives (None: with the stream)
    overlap: OverlapName | None = None  # tbo/dbo: two micro-batches; asynctp: GEMMs fused with their collectives
    engine_notes: tuple[str, ...] = ()  # what an engine's own static gates say (not legality)
    found_by: str = "named"  # "named" or "search"
    notes: tuple[str, ...] = field(default=(), compare=False)  # for the user: where the plan came from
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def bank_placement(self) -> Placement:
        """Where K3's attention-residual bank lives: the plan's `bank`, else the stream's placement."""
        return self.bank if self.bank is not None else self.stream

    def physical_experts(self, logical: int) -> int:
        """Routed experts the EP group holds for `logical` experts: each one once, plus the redundant copies
        (`tpplan.engines.redundant_experts`)."""
        return logical + self.redundant_experts

    def gathers(self, producer: str) -> bool:
        return _match(self.gather, producer)

    def gathers_for(self, producer: str, consumer: str) -> bool:
        if not self.gather_for:
            return False
        if (producer, consumer) in self.gather_for:
            return True
        return any(_match((p,), producer) and _match((c,), consumer) for p, c in _inexact_pairs(self.gather_for))

    def a2a_of(self, producer: str) -> bool:
        return _match(self.a2a, producer)

    def replicates(self, op: str) -> bool:
        return _match(self.replicate, op)

    def shards_tokens(self, op: str) -> bool:
        return _match(self.token_shard, op)

    def folds(self, op: str) -> bool:
        return _match(self.fold, op)

    def with_(self, **changes: object) -> Plan:
        return replace(self, **changes)  # type: ignore[arg-type]  # Plan's fields by name: unchecked through **

    def describe(self) -> dict[str, object]:
        """The decisions, as plain data (for JSON and for showing a found plan); `fold` and `bank` appear
        only where the plan sets them (no searched plan does)."""
        out: dict[str, object] = {
            "stream": str(self.stream),
            "reduce": str(self.reduce),
            "gather": sorted(self.gather),
            "gather_for": sorted(f"{p} -> {c}" for p, c in self.gather_for),
            "a2a": sorted(self.a2a),
            "replicate": sorted(self.replicate),
            "token_shard": sorted(self.token_shard),
            "moe": self.moe if self.moe != "ep" else f"ep{self.ep_size}",
        }
        if self.fold:
            out["fold"] = sorted(self.fold)
        if self.bank is not None:
            out["bank"] = str(self.bank)
        if self.redundant_experts:
            out["redundant_experts"] = self.redundant_experts
        if self.dp_attention:
            out["dp_attention"] = self.dp_attention
        if self.overlap:
            out["overlap"] = self.overlap
        return out


# The baseline and its EP variant live beside Plan, not with the other named plans
# (tpplan.plans.named), because the layout needs them: a chunk too small to scatter runs them
# (`layout.schedule.fallback_plan`).


def baseline() -> Plan:
    return Plan(
        "baseline",
        "Megatron TP",
        "All-reduce the hidden after o_proj and after the MLP/MoE; every token-local op runs on every rank.",
    )


def with_overlap(plan: Plan, overlap: OverlapName) -> Plan:
    """The plan run as two interleaved micro-batches (`tpplan.engines.overlap`: SGLang's `tbo`, vLLM's
    `dbo`), whose MoE all-to-alls hide behind the other micro-batch's compute. Same collectives and
    bytes; only the schedule, and so the time, changes. Needs an all-to-all MoE to overlap."""
    if plan.moe != "a2a":
        raise TpplanError(
            f"{plan.name}+{overlap}",
            f"micro-batch overlap hides the MoE all-to-all, and plan {plan.name} has none (MoE mode {plan.moe})",
            f"overlap a plan with all-to-all experts, e.g. dp-attention+a2a+{overlap} or sp-moe+{overlap}",
        )
    what = {"tbo": "SGLang two-batch overlap", "dbo": "vLLM dual-batch overlap"}[overlap]
    return plan.with_(
        name=f"{plan.name}+{overlap}",
        title=f"{plan.title}, {what}",
        summary=f"{plan.summary} Two micro-batches interleaved: each one's dispatch and combine run while the "
        "other computes.",
        overlap=overlap,
    )


def with_ep(plan: Plan, mesh: Mesh) -> Plan:
    """Expert parallelism without all-to-all at `mesh`'s EP (the seed's TP32/EP4): E/ep experts per group
    of N/ep ranks of its TP group, each expert split over its group; tokens stay replicated, the MoE
    output is reduced as under TP. The plan keeps the size (`Plan.ep_size`, `ep<k>` in its name)."""
    ep = mesh.ep if mesh.ep is not None else 0
    if ep < 1:
        raise TpplanError(f"ep{ep}", "the EP size must be at least 1", "use e.g. ep4")
    name = f"ep{ep}" if plan.name == "baseline" else f"{plan.name}+ep{ep}"
    return plan.with_(
        name=name,
        title=f"{plan.title}, EP{ep} experts",
        summary=f"{plan.summary} Routed experts in {ep} groups (EP{ep}), each expert split over its group; "
        "no all-to-all.",
        moe="ep",
        ep_size=ep,
    )


__all__ = ["S_TOK", "DpPadding", "MoEMode", "OverlapName", "Plan", "R", "baseline", "with_ep", "with_overlap"]
