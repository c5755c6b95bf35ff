"""The program one rank runs for one batch: the typed steps `tpplan.lower.lower` produces.

Propagation (`tpplan.layout.propagate`) decides, per layer, how every op runs and which values move;
the lowering turns those decisions, for a mesh and a batch, into steps with sizes: a kernel call per
op at its per-rank shape, a collective per planned move (its buffer as the runtime hands it to
torch.distributed and the volume the cost model prices), the runtime's layout copies beside them,
the pipeline's send/recv at stage boundaries. The cost model prices these steps and the runtime's
expected trace lists their collectives, so neither derives them again. Planner-only: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from tpplan.layout.propagate import CommEvent, OpDecision


@dataclass(frozen=True)
class KernelCall:
    """One op's kernel on one rank. `shape` is the per-rank GEMM (M, K, N) (the first grouped GEMM for
    routed experts), None for other cost classes; `rows` the token rows the rank runs it on.
    `redundant`: every rank does the same whole op (work a token-sharded plan could save).
    `repeat_of`/`times`: extra passes of an op already listed (CP's scan correction, the serial chain's
    wait, `--cp-layers mla`'s K/V expansion for every key), priced as that op `times` over.
    Routed experts: `experts` is the rank's share (experts, intermediate width, routed rows;
    `OpKindDef.expert_share`), `ep_size` the EP group where they are split EP (`Plan.ep_size`)."""

    op: str
    kind: str  # the op kind (`OpKind` value)
    cost_class: str  # the op-kind registry's cost entry: gemm, experts, attention, recurrence, ...
    rows: int
    shape: tuple[int, int, int] | None
    dtype: str
    redundant: bool
    decision: OpDecision = field(repr=False)  # what propagation decided (share, split, strategy)
    origin: str = "tp_sp"  # the pass that emitted it
    repeat_of: str | None = None
    times: int = 1
    ep_size: int | None = None
    experts: tuple[int, int, float] | None = None


@dataclass(frozen=True)
class Collective:
    """One collective call on one rank. `shape`/`dtype`/`bytes`: the buffer handed to torch.distributed
    (nccl-tests size; token-sharded buffers padded to a multiple of the group), `sent_bytes` what the
    rank sends of it. `priced_bytes`: the nccl-tests size the cost model prices, of the real rows in the
    batch's activation dtype (no padding; fp32 router scores counted at the activation's size); equal to
    `bytes` when the group divides the tokens and no value is wider than the activations."""

    kind: str  # all_reduce | reduce_scatter | all_gather | all_to_all | send_recv
    value: str  # graph value moved (MoE: `<input>:counts|dispatch|combine`; "final" before the last norm)
    label: str  # the cost model's name for it
    region: str  # attn_side | mlp_side | cp | ...
    axis: str  # mesh axis of the group: tp, ep, cp, attn_tp, pp
    group: int
    ranks_per_node: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    sent_bytes: float
    priced_bytes: float
    chain: int = 1  # calls one after another on the critical path (CP's serial state hand-off)
    priced: bool = True  # False: left out of the cost model (the all-to-all's send counts, a few bytes)
    origin: str = "tp_sp"
    event: CommEvent | None = field(default=None, repr=False)  # the planned move it lowers, if one
    op: str | None = None  # the op whose exchange it is, where no planned move names one (CP's)


@dataclass(frozen=True)
class LayoutCopy:
    """The runtime's copy beside a collective (`pack:<value>` before it, `unpack:<value>` after it),
    memory-bound work of its own; `elements` is read + write of the local buffer."""

    name: str
    value: str
    elements: float
    origin: str = "tp_sp"


@dataclass(frozen=True)
class SendRecv:
    """A pipeline-stage boundary: each rank sends its 1/group slice of `width` features per token to
    its peer in the next stage (`bytes` per rank), which re-gathers it over TP where `gather` holds."""

    into_stage: int
    layer: int  # first layer of the receiving stage
    width: int
    bytes: float
    cross_node: bool
    gather: Collective | None  # the receivers' all-gather over TP (None at TP 1)
    gather_optional: bool  # the stream is token-sharded: a schedule that does not re-gather skips it
    origin: str = "pp"


Step = KernelCall | Collective | LayoutCopy | SendRecv


@dataclass(frozen=True)
class LayerProgram:
    """One layer's steps, in the order the rank runs them: each collective just before the op that
    needs it (its layout copies beside it), then the steps later passes add, in pass order."""

    index: int
    kind: str
    steps: tuple[Step, ...]

    def with_before(self, consumer: str, steps: list[Step]) -> LayerProgram:
        """These steps inserted just before the kernel of op `consumer` (at the end if it has none)."""
        at = next((i for i, s in enumerate(self.steps) if isinstance(s, KernelCall) and s.op == consumer),
                  len(self.steps))  # fmt: skip
        return replace(self, steps=(*self.steps[:at], *steps, *self.steps[at:]))

    def with_after(self, op: str, steps: list[Step]) -> LayerProgram:
        """These steps inserted just after the kernel of op `op` (at the end if it has none)."""
        at = next((i + 1 for i, s in enumerate(self.steps) if isinstance(s, KernelCall) and s.op == op),
                  len(self.steps))  # fmt: skip
        return replace(self, steps=(*self.steps[:at], *steps, *self.steps[at:]))

    def kernels(self) -> list[KernelCall]:
        return [s for s in self.steps if isinstance(s, KernelCall)]

    def collectives(self) -> list[Collective]:
        return [s for s in self.steps if isinstance(s, Collective)]

    def copies(self) -> list[LayoutCopy]:
        return [s for s in self.steps if isinstance(s, LayoutCopy)]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch's share of the batch: its segments (the whole batch unless a micro-batch
    overlap splits it; under CP each CP rank takes its share of them) and what the overlap pass says
    about how the two interleave."""

    index: int
    segments: tuple[tuple[int, int], ...]
    overlap: str | None = None  # tbo/dbo: interleaved with the other micro-batch; asynctp: GEMMs fused


@dataclass(frozen=True)
class StageProgram:
    """One pipeline stage: its layers, its micro-batches, and the send into the next stage."""

    index: int
    layers: tuple[LayerProgram, ...]
    micro_batches: tuple[MicroBatch, ...]
    send: SendRecv | None = None
    final: tuple[Collective, ...] = ()  # the last stage: the reduction before the final norm

    def steps(self) -> Iterator[Step]:
        for layer in self.layers:
            yield from layer.steps
        yield from self.final
        if self.send is not None:
            yield self.send


@dataclass(frozen=True)
class FusedPair:
    """Async TP: a collective run fused with the GEMMs beside it (`tpplan.layout.fused_gemm`)."""

    layer: int
    pattern: str  # ag_gemm | gemm_rs
    collective: str  # the collective's value
    gemms: tuple[str, ...]  # the GEMM ops (of the layer before when `from_previous`)
    from_previous: bool = False


@dataclass(frozen=True)
class Program:
    """Per pipeline stage and micro-batch, the steps one rank runs for one batch under one plan."""

    plan: str
    tp: int
    batch_tokens: int  # new tokens of the batch one rank lowers (its CP share under CP)
    stages: tuple[StageProgram, ...]
    fused: tuple[FusedPair, ...] = ()
    notes: tuple[str, ...] = ()  # what a pass decided that a reader should know (fallbacks, rewrites)

    @property
    def layers(self) -> tuple[LayerProgram, ...]:
        return tuple(layer for s in self.stages for layer in s.layers)

    def layer(self, index: int) -> LayerProgram:
        return self.layers[index]

    def steps(self) -> Iterator[Step]:
        for s in self.stages:
            yield from s.steps()

    def collectives(self) -> list[Collective]:
        """Every collective in run order, the stage boundaries' re-gathers included."""
        out: list[Collective] = []
        for s in self.steps():
            if isinstance(s, Collective):
                out.append(s)
            elif isinstance(s, SendRecv) and s.gather is not None:
                out.append(s.gather)
        return out


__all__ = [
    "Collective",
    "FusedPair",
    "KernelCall",
    "LayerProgram",
    "LayoutCopy",
    "MicroBatch",
    "Program",
    "SendRecv",
    "StageProgram",
    "Step",
]
