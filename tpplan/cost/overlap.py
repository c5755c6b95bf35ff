"""Micro-batch overlap priced as the engines schedule it (`tpplan.engines.overlap`): two micro-batches
interleaved stage by stage on one compute stream, each one's MoE all-to-all on the communication
SMs while the other computes.

The price is a simulation of that order, not max(compute, communication): stage k of micro-batch A,
then stage k of B; a stage that waits for its all-to-all blocks the compute stream until it lands;
all-to-alls run one after another on the communication SMs in the order they were launched. What
the overlap costs the compute side is explicit (`OverlapCosts`): DeepGEMM kernels run on the SMs the
all-to-all leaves (both engines set its SM count), and the other kernels share HBM with it (the
slowdowns measured on one H200 beside a kernel holding the all-to-all's 20 SMs, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tpplan.cost.prediction import KindTime, OpTime
from tpplan.cost.segments import Segments, batch_pairs
from tpplan.engines.overlap import MicroBatchOverlap
from tpplan.layout.propagate import LayerResult

# What the engines' GEMMs and experts run through under the overlap: both cut DeepGEMM's SM count.
SM_BOUND = frozenset({"gemm", "moe"})


@dataclass(frozen=True)
class OverlapCosts:
    """How much slower compute runs beside an all-to-all, per op category, and the all-to-all beside
    compute, as measured on one H200 (docs/benchmarks.md, "Compute beside a kernel that holds 20 SMs";
    files docs/benchmarks/h200-2026-12-02b): a persistent side kernel held 20 of the 132 SMs, as
    DeepEP's all-to-all does, and copied at 100 or 300 GB/s (a link's rate) while each op ran.

    - SM-bound ops (GEMMs, routed experts) lose the all-to-all's SMs: sm_count / (sm_count -
      comm_sms), because the engines tell DeepGEMM its SM count (engine source). cuBLAS, which is
      not told, measured 1.14-1.29 at GEMMs of 0.5-1 ms (this rule: 1.18) but 1.40-1.76 below
      0.4 ms, and batched bf16 experts 1.36-1.40: a kernel not told the SM count is slower than this.
    - attention: 1.13 (causal SDPA at 8K tokens, 1.09-1.19 over 4 points);
    - memory-bound ops (norms, elementwise, recurrences): 1.49 (an RMSNorm chain, 1.41-1.57);
    - the all-to-all itself: 1.03 (its bytes/s beside the 12 ops, median of 48 points, 1.00-1.08):
      on SMs of its own, at a link's rate, it hardly slows.
    Measured on H200 only; other GPUs use the same figures (not measured)."""

    sm_count: int
    comm_sms: int
    attention: float = 1.13
    memory_bound: float = 1.49
    comm: float = 1.03

    def factor(self, category: str) -> float:
        if category in SM_BOUND:
            return self.sm_count / max(1, self.sm_count - self.comm_sms)
        if category == "attention":
            return self.attention
        if category in ("elementwise", "recurrence"):
            return self.memory_bound
        return 1.0


@dataclass(frozen=True)
class Work:
    """Compute on the compute stream: its seconds with the GPU to itself, and with an all-to-all
    running beside it the whole time (`OverlapCosts`). The simulation charges the second only for
    the part that really runs beside an all-to-all."""

    alone: float
    beside: float

    def seconds(self, overlapped: float) -> float:
        """Wall seconds when an all-to-all runs beside it for the first `overlapped` seconds."""
        if overlapped >= self.beside or self.beside <= 0.0:
            return self.beside
        return overlapped + self.alone * (1.0 - overlapped / self.beside)


Compute = float | Work  # a plain float: the same seconds beside an all-to-all as alone


def _work(c: Compute) -> Work:
    return c if isinstance(c, Work) else Work(c, c)


@dataclass(frozen=True)
class MoeStages:
    """One micro-batch of one MoE layer, cut where the engines cut it (seconds)."""

    pre: Compute  # from the layer input through the router (and any blocking TP collective there)
    dispatch: float
    experts: Compute
    combine: float
    shared: Compute  # computed before waiting for the combine
    post: Compute  # after the combine lands: the expert sum, the residual add


def moe_stages(kt: KindTime, costs: OverlapCosts, shared_first: bool = True) -> MoeStages | None:
    """A MoE layer's time for one micro-batch as the engine's three stages (None: no all-to-all MoE).

    Ops keep their graph order: everything before the routed experts is `pre`, the shared-expert ops
    after them `shared`, the rest `post`. Collectives other than the all-to-all stay on the compute
    stream where they are needed (a TP all-gather before attention is `pre`)."""
    experts = next((i for i, o in enumerate(kt.ops) if o.category == "moe"), None)  # the routed experts
    dispatch = [c for c in kt.collectives if c.kind == "all_to_all" and ":dispatch[" in c.label]
    combine = [c for c in kt.collectives if c.kind == "all_to_all" and ":combine[" in c.label]
    if experts is None or not dispatch or not combine:
        return None

    def cost(ops: Sequence[OpTime], extra: float = 0.0) -> Work:
        alone = sum(o.seconds for o in ops) + extra
        return Work(alone, sum(o.seconds * costs.factor(o.category) for o in ops) + extra)

    after = kt.ops[experts + 1 :]
    shared = [o for o in after if shared_first and o.op.startswith("shared_")]
    rest = [o for o in after if o not in shared]
    blocking = sum(c.seconds for c in kt.collectives if c.kind != "all_to_all")
    return MoeStages(
        pre=cost(kt.ops[:experts], blocking),
        dispatch=sum(c.seconds for c in dispatch) * costs.comm,
        experts=cost([kt.ops[experts]]),
        combine=sum(c.seconds for c in combine) * costs.comm,
        shared=cost(shared),
        post=cost(rest),
    )


Item = tuple[str, Compute, str]  # ("compute", work, "") | ("launch", seconds, key) | ("wait", 0, key)


def _stages(mb: Sequence[MoeStages], tag: str) -> list[list[Item]]:
    """One micro-batch's stages over consecutive layers: [pre, launch dispatch], [wait, experts,
    launch combine], [shared, wait, post, next layer's pre, launch its dispatch], ..."""
    stages: list[list[Item]] = [[]]
    for i, s in enumerate(mb):
        d, c = f"{tag}{i}d", f"{tag}{i}c"
        stages[-1] += [("compute", s.pre, ""), ("launch", s.dispatch, d)]
        stages.append([("wait", 0.0, d), ("compute", s.experts, ""), ("launch", s.combine, c)])
        stages.append([("compute", s.shared, ""), ("wait", 0.0, c), ("compute", s.post, "")])
    return stages


def two_microbatch_seconds(a: Sequence[MoeStages], b: Sequence[MoeStages]) -> float:
    """Seconds for consecutive MoE layers (`a[i]`, `b[i]`: layer i of micro-batch A and B) run in the
    engines' order: stage k of A, then stage k of B (SGLang `execute_overlapped_operations` with
    prefill's delta_stages 0; vLLM's two micro-batch threads switch at the same all-to-all points).

    One compute stream; the all-to-alls queue on the communication SMs in launch order. Compute runs
    at its `beside` rate while an all-to-all is in flight and at its `alone` rate once none is (the
    queue is busy from the last launch until `comm`), so a short all-to-all slows only the compute
    it really overlaps."""
    compute = comm = 0.0
    landed: dict[str, float] = {}
    sa, sb = _stages(a, "a"), _stages(b, "b")
    for stage_a, stage_b in zip(sa, sb, strict=True):
        for what, seconds, key in (*stage_a, *stage_b):
            if what == "compute":
                compute += _work(seconds).seconds(max(0.0, comm - compute))
            elif what == "launch":
                comm = max(comm, compute) + _work(seconds).alone
                landed[key] = comm
            else:
                compute = max(compute, landed[key])
    return max(compute, comm)


def sequential_seconds(stages: Sequence[MoeStages]) -> float:
    """The same layers without overlap: every stage and all-to-all one after another (nothing runs
    beside the compute, so at its `alone` rate)."""
    return sum(
        _work(s.pre).alone
        + s.dispatch
        + _work(s.experts).alone
        + s.combine
        + _work(s.shared).alone
        + _work(s.post).alone
        for s in stages
    )


KindTimeOf = Callable[[LayerResult, Segments], KindTime]


def _half(half: KindTime, whole: KindTime, share: float) -> KindTime:
    """A micro-batch's layer time with its attention at `share` of the whole batch's: the engines' flash
    kernels run the half that follows a cut request with that part as prefix at the causal rate, which
    tpplan's own prefix-attention kernel model (fitted on its SDPA path) does not describe."""
    whole_attn = {o.op: o.seconds for o in whole.ops if o.category == "attention"}
    ops = [replace(o, seconds=whole_attn[o.op] * share) if o.op in whole_attn else o for o in half.ops]
    return KindTime(half.kind, half.count, ops, half.collectives)


def overlapped_seconds(
    kind_time: KindTimeOf,
    results: Sequence[LayerResult],
    segs: Segments,
    halves: tuple[Segments, Segments] | None,
    engine: MicroBatchOverlap,
    costs: OverlapCosts,
) -> float:
    """Seconds for these consecutive layers of one batch under the engine's micro-batch overlap, the batch
    cut into the two micro-batches `halves` (the lowered program's, `tpplan.lower.passes.overlap`).

    MoE layers with an all-to-all run staged (`two_microbatch_seconds`, each run of consecutive ones
    simulated together); the others as the engine runs them: SGLang on the whole batch, vLLM as the
    two micro-batches in turn. A batch the engine does not split (`halves` None) is priced as without
    overlap."""
    if halves is None:
        return sum(kind_time(r, segs).total_s for r in results)
    a_segs, b_segs = halves
    pairs = batch_pairs(segs)[1]
    share_a = batch_pairs(a_segs)[1] / pairs if pairs else 0.5
    total = 0.0
    run_a: list[MoeStages] = []
    run_b: list[MoeStages] = []

    def flush() -> float:
        secs = two_microbatch_seconds(run_a, run_b) if run_a else 0.0
        run_a.clear()
        run_b.clear()
        return secs

    for r in results:
        whole = kind_time(r, segs)
        a = _half(kind_time(r, a_segs), whole, share_a)
        b = _half(kind_time(r, b_segs), whole, 1.0 - share_a)
        shared_first = engine.shared_experts_before_combine_wait
        sa, sb = moe_stages(a, costs, shared_first), moe_stages(b, costs, shared_first)
        if sa is not None and sb is not None:
            run_a.append(sa)
            run_b.append(sb)
            continue
        total += flush()
        if engine.dense_layers == "whole batch":
            total += whole.total_s
        else:
            total += a.total_s + b.total_s
    return total + flush()
