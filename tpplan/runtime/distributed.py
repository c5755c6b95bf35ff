"""Execute any plan for real on torch.distributed: a plan interpreter over sharded weights.

Public entry points (a benchmark can build on these):

- `PlanRunner(graph, plan, n, rank, source, comm=..., dtype=..., device=..., force=False, observer=None)`:
  one rank's executor (`observer`: a `tpplan.runtime.observe.RunObserver` told of every layer, op,
  layout copy and collective, e.g. to time them). It audits the plan (an illegal plan raises
  `TpplanError` with the audit's reason unless `force`), shards the weights (`tpplan.runtime.shard`), and
  `runner.prefill(ids, chunk=C)` runs a prefill, chunk by chunk with KV cache / recurrent state
  carried in `runner.state`, returning this rank's final hidden (`Held`: tensor + placement).
  `runner.tracer.calls` lists every collective issued (`CollectiveCall`), `runner.tracer.events`
  the fallbacks, `runner.tracer.copies` the layout copies run beside the collectives (`pack:<value>`
  before an all-to-all to head-sharded or a padded reduce-scatter, `unpack:<value>` after a head
  all-gather; see `_layout`). `runner.forward_chunk(ids, observe=fn)` runs one chunk and calls
  `fn(layer, env)` after every layer with the rank's local values.
- `make_comm(rank, n)`: the traced collectives (`tpplan.runtime.trace.Comm`) on the default group.
- `full_value(comm, held, value_heads, tokens)`: untraced gather of a local value to its full
  [T, W] (verification only).
- Around it: `tpplan.runtime.verify.verify_cases` (reference vs sharded, trace vs prediction,
  many cases per process group), `tpplan.runtime.run.run_plan` (time a prefill, slowest rank),
  `tpplan.lower.schedule.predict_schedule` (the calls a batch will make, torch-free), and
  `tpplan.runtime.group.run_group` (spawned or torchrun group, names the rank that failed first).

Minimal use on an initialised process group (one process per rank):

    from tpplan.runtime.distributed import PlanRunner, make_comm
    from tpplan.runtime.shard import DictSource
    runner = PlanRunner(graph, plan, world, rank, DictSource(full_state_dict),
                        comm=make_comm(rank, world), device=device, dtype=torch.bfloat16)
    finals = runner.prefill(token_ids, chunk=8192)   # one Held per chunk
    runner.tracer.calls                              # CollectiveCall list; runner.reset() between runs

How it runs: every rank gets all token ids of the chunk (as an engine's TP ranks do), embeds
with its vocab rows (a partial sum), then walks each layer's graph. For every op it takes the
placements the propagation assigned (`OpDecision`): first the conversions the plan names for
that edge (all-gathers, all-to-alls), then the reductions of partial sums (all-reduce to R,
reduce-scatter to S(tok)), then free local steps (row or head slices; R -> P keeps the value on
rank 0). Each collective is checked against the layer's `CommEvent`s: a conversion the plan does
not name is an error.

`force` runs an illegal plan the way a careless implementation would, so its error shows: the
plan is first repaired by all-gathers (`plans.named.repair(how="gather")`) to get a placement for
every value, and at each edge the original plan cannot serve, the runner does the cheap wrong
thing instead of the gather: a column-parallel weight that receives token-sharded input is
applied to the rank's own tokens, and those per-rank slices are all-gathered by token (the seed
memo's variant: each gathered slice was made with another rank's heads). Other added
collectives run as repaired. Everything the original plan does not name is traced with
`planned=False`. The op itself runs the single-process kernel
(`executor.execute_op`) on the local tensors; MoE under `moe="a2a"` dispatches each real token
once to every rank hosting one of its experts and combines the results (all-to-all with the
exact row counts). Token-sharded values hold ceil(T/N) rows per rank (padded); a chunk with fewer
tokens than ranks runs the baseline plan instead, keeping its TP/EP experts (see
`tpplan.layout.schedule.falls_back`; MoE all-to-all plans pad instead), and the trace records it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from tpplan.audit import audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.dp_attention import stream_reduction
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, LayerResult, OpDecision
from tpplan.layout.schedule import fallback_plan, falls_back, layer_results, padded_rows, token_range
from tpplan.layout.transitions import transition
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph, Op, WeightSplit
from tpplan.models.opkinds import op_kind, run_experts
from tpplan.placement import S_COL, S_TOK, P, Placement, R
from tpplan.plans.named import repair
from tpplan.runtime import kernels as K
from tpplan.runtime.executor import ExecContext, RunState, execute_op, final_hidden, numerics_for
from tpplan.runtime.hooked_comm import make_comm
from tpplan.runtime.hooks import before_collective
from tpplan.runtime.observe import RunObserver
from tpplan.runtime.shard import ModelShard, WeightSource, expert_ownership, shard_model
from tpplan.runtime.trace import Comm, TraceEvent
from tpplan.runtime.transitions import RUNTIME_DP_TRANSITIONS, RUNTIME_TRANSITIONS, Move
from tpplan.runtime.weights import Numerics


@dataclass
class Held:
    """A value as one rank holds it: the local tensor and its placement."""

    t: Tensor
    pl: Placement


class PlanViolation(RuntimeError):
    """The interpreter was asked for a collective the plan does not name (a bug, or an illegal plan)."""


Observer = Callable[[int, dict[str, Held]], None]


class ContextHook(Protocol):
    """What a context-parallel deployment adds to a TP group's run (`runtime.context_parallel`)."""

    def own_positions(self, tokens: int) -> Tensor: ...

    def mix(
        self, runner: PlanRunner, op: Op, tensors: list[Tensor], w: dict[str, Tensor], ctx: ExecContext
    ) -> Tensor: ...


def check_legal(graph: ModelGraph, plan: Plan, n: int) -> None:
    """Raise the audit's reason when `plan` is illegal for this model at TP `n`."""
    pa = audit_plan(graph, plan, n, "fp32")
    if not pa.legal:
        first = pa.violations[0]
        raise TpplanError(
            f"plan={plan.name} (tp={n})",
            f"the audit calls this plan illegal: {first.sentence()}"
            + (f" (+{len(pa.violations) - 1} more)" if len(pa.violations) > 1 else ""),
            "pick a legal plan (tpplan audit lists them), or pass force= to run it and see the mismatch",
        )


class PlanRunner:
    """One rank's interpreter of a plan (see the module docstring)."""

    def __init__(
        self,
        graph: ModelGraph,
        plan: Plan,
        n: int,
        rank: int,
        source: WeightSource,
        *,
        comm: Comm,
        numerics: Numerics | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        force: bool = False,
        observer: RunObserver | None = None,
        context_parallel: ContextHook | None = None,
    ) -> None:
        legal = audit_plan(graph, plan, n, "fp32").legal
        if not force:
            check_legal(graph, plan, n)
        self.graph, self.plan, self.n, self.rank = graph, plan, n, rank
        self.exec_plan = plan if legal else _repaired(graph, plan, n)
        self.source, self.comm, self.tracer = source, comm, comm.tracer
        # Sees every layer, op, layout copy and (through the comm) collective: `runtime.observe`.
        self.observer = observer
        if observer is not None:
            comm.observer = observer
        self.numerics = numerics or numerics_for(graph)
        self.device = device or torch.device("cpu")
        self.dtype, self.force = dtype, force
        self.results = layer_results(graph, self.exec_plan, n)
        # What the plan itself names, per layer: anything else the runner issues is unplanned.
        self.planned = [{(c.value, c.dst) for c in r.comms} for r in layer_results(graph, plan, n)]
        self.shard = self._shard(self.results, self.exec_plan)
        self._fallback: tuple[Plan, list[LayerResult], ModelShard] | None = None
        self._counts_ahead: dict[str, tuple[Tensor, Tensor, Any]] = {}  # MoE counts exchanged after the router
        self.state = RunState()
        self.chunk_index = 0
        self.dp_position = 0  # DP attention: tokens of this rank's own requests processed so far
        rope = K.Rope(self.numerics.rope_theta, self.numerics.rope_interleave, self.numerics.rope_scaling,
                      self.numerics.max_position_embeddings)  # fmt: skip
        self.rope = rope
        # Context parallelism (`runtime.context_parallel`): this TP group holds only the tokens at
        # `own_positions(t)`, and every token mixer runs through `mix`, which reaches the CP peers.
        self.context_parallel = context_parallel
        self.env: dict[str, Held] = {}  # the current layer's values (what a CP mixer may read besides its inputs)

    def _shard(self, results: list[LayerResult], plan: Plan) -> ModelShard:
        return shard_model(self.graph, results, self.n, self.rank, self.source, self.numerics, plan=plan,
                           device=self.device, dtype=self.dtype)  # fmt: skip

    def reset(self) -> None:
        """Forget the carried state and the trace: the next prefill starts a new sequence."""
        self.state = RunState()
        self.chunk_index = 0
        self.dp_position = 0
        self.tracer.calls.clear()
        self.tracer.events.clear()
        self.tracer.copies.clear()

    # -- public runs ----------------------------------------------------------------------------

    def prefill(self, ids: Tensor, chunk: int | None = None, observe: Observer | None = None) -> list[Held]:
        """Run `ids` (every rank passes all of them) in chunks of `chunk`; one final hidden per chunk."""
        ids = ids.reshape(-1).to(self.device)
        step = chunk or ids.numel()
        return [self.forward_chunk(ids[s : s + step], observe) for s in range(0, ids.numel(), step)]

    def forward_chunk(self, ids: Tensor, observe: Observer | None = None) -> Held:
        """One prefill chunk through every layer; returns the final normed hidden in the stream placement."""
        t = ids.numel()
        plan, results, shard = self.exec_plan, self.results, self.shard
        if falls_back(self.graph, self.plan, self.n, t):
            plan, results, shard = self._fallback_plan()
            self.tracer.events.append(
                TraceEvent(self.chunk_index, "fallback", f"{t} tokens < {self.n} ranks: {plan.name} for this chunk")
            )
        self.tracer.chunk = self.chunk_index
        nu = self.numerics
        positions = torch.arange(self.state.position, self.state.position + t, device=self.device)
        if self.context_parallel is not None:
            positions = self.context_parallel.own_positions(t).to(self.device)
        ctx = ExecContext(nu, positions, rope=self.rope, tp=self.n)
        stream = plan.stream
        rows = padded_rows(t, self.n)[1] if stream is S_TOK else t
        h = self.graph.hidden
        resid = Held(torch.zeros(rows, h, device=self.device, dtype=self.dtype), stream)
        delta = self._dp_embed(ids, shard, rows) if plan.dp_attention else Held(self._embed(ids, shard), P)
        bank_pl = plan.bank_placement  # K3's snapshot bank: with the stream, or on every row (sglang-sp-moe)
        bank_rows = padded_rows(t, self.n)[1] if bank_pl is S_TOK else t
        bank = Held(resid.t.new_zeros(bank_rows, 0, h), bank_pl)
        block = self.graph.spec.attn_res_block_size
        for i, kind in enumerate(self.graph.layer_kinds):
            lg = self.graph.kinds[kind]
            self.tracer.layer = i
            ctx.layer, ctx.values = i, lg.values
            env: dict[str, Held] = {"resid": resid, "delta": delta, "bank": bank}
            planned = self.planned[i] if plan is self.exec_plan else {(c.value, c.dst) for c in results[i].comms}
            span = self.observer.open("layer", i, "") if self.observer else None
            self._layer(i, lg, results[i], planned, shard, env, ctx, t, bool(block and i % block == 0))
            if self.observer:
                self.observer.close(span)
            bank = env["bank"]
            resid = env[lg.middle_add.output]
            delta = env["mlp_out"]
            if observe is not None:
                observe(i, env)
        self.tracer.layer = len(self.graph.layer_kinds)
        stream, delta, resid, bank = self._into_stream(plan, stream, delta, resid, bank, t)
        hidden = final_hidden(shard.top, nu, resid.t, delta.t, bank.t, block)
        self.state.position += t
        if plan.dp_attention:
            lo, hi = token_range(t, self.n, self.rank)
            self.dp_position += hi - lo
        self.chunk_index += 1
        return Held(hidden, stream)

    def _into_stream(
        self, plan: Plan, stream: Placement, delta: Held, resid: Held, bank: Held, t: int
    ) -> tuple[Placement, Held, Held, Held]:
        """After the last layer: the block output, the residual and the bank moved into the stream's
        placement for the final add and norm (the stream itself may move to S(tok))."""
        if delta.pl is S_TOK and stream is R:  # the last MoE output left on the rank's rows (vllm-moe-chunk):
            stream = S_TOK  # the final add and norm run there, on a free slice of the stream
        if delta.pl is not stream:  # the last block's output, moved into the stream before the final norm
            # P: reduced; R under an S(tok) stream (a sandwich norm already reduced it): a free slice.
            if not (delta.pl is P or (delta.pl is R and stream is S_TOK)):
                raise PlanViolation(f"the last block's output is {delta.pl} but the stream is {stream}")
            final = Move(self.comm, "final", 0, t, layout=self._layout)
            call = RUNTIME_TRANSITIONS[(delta.pl, stream)]
            if delta.pl is P:  # DP attention's SUM_LEN reduces by all-reduce, then keeps the rank's rows
                call = RUNTIME_DP_TRANSITIONS.get((P, stream, stream_reduction(plan).collective), call)  # type: ignore[arg-type]
            delta = Held(call(final, delta.t), stream)
        if resid.pl is R and stream is S_TOK:  # the last add folded the stream back to every row
            mine = Move(self.comm, "resid", 0, t, layout=self._layout)
            resid = Held(RUNTIME_TRANSITIONS[(R, S_TOK)](mine, resid.t), stream)
        if (
            self.graph.spec.attn_res_block_size and bank.pl is R and stream is S_TOK
        ):  # a bank on every row: the rank's rows of it (a free slice)
            bank = Held(RUNTIME_TRANSITIONS[(R, S_TOK)](Move(self.comm, "bank", 0, t), bank.t), S_TOK)
        return stream, delta, resid, bank

    # -- internals ------------------------------------------------------------------------------

    def _fallback_plan(self) -> tuple[Plan, list[LayerResult], ModelShard]:
        if self._fallback is None:
            base = fallback_plan(self.plan, Mesh(self.n))
            assert base is not None
            res = layer_results(self.graph, base, self.n)
            self._fallback = (base, res, self._shard(res, base))
        return self._fallback

    def _dp_embed(self, ids: Tensor, shard: ModelShard, rows: int) -> Held:
        """DP attention: the rank looks up its own requests' tokens in the whole table (padded rows zero)."""
        lo, hi = token_range(ids.numel(), self.n, self.rank)
        out = shard.embed.new_zeros(rows, shard.embed.shape[1])
        out[: hi - lo] = shard.embed[ids[lo:hi]]
        nu = self.numerics
        return Held(out * nu.embed_scale if nu.embed_scale != 1.0 else out, S_TOK)

    def _embed(self, ids: Tensor, shard: ModelShard) -> Tensor:
        """Vocab-parallel lookup: rows this rank holds, zeros elsewhere (a partial sum). A gather and a select,
        never a boolean-mask index: that is a `nonzero`, which waits for the GPU to finish everything queued
        (06e: it held `bench --timing host-ahead`'s host behind the GPU at every chunk's start)."""
        local = ids - shard.vocab_lo
        mine = (local >= 0) & (local < shard.embed.shape[0])
        rows = shard.embed[local.clamp(0, shard.embed.shape[0] - 1)]
        out = torch.where(mine[:, None], rows, rows.new_zeros(()))
        return out * self.numerics.embed_scale if self.numerics.embed_scale != 1.0 else out

    def _layer(
        self, i: int, lg: LayerGraph, res: LayerResult, planned: set[tuple[str, Placement]], shard: ModelShard,
        env: dict[str, Held], ctx: ExecContext, tokens: int, boundary: bool,
    ) -> None:  # fmt: skip
        named = {(c.value, c.dst): c for c in res.comms if not c.internal}
        done: dict[tuple[str, Placement], Held] = {}
        self._planned = planned
        # Partial sums that may be all-reduced in their own storage: no op reads them as P and no
        # other conversion starts from them.
        read_as_partial = {
            v for d in res.decisions for v, need in zip(d.op.inputs, d.strategy.inputs, strict=True) if need is P
        }
        self._reduce_inplace = {
            v for (v, dst) in named if dst is R and v not in read_as_partial and (v, S_TOK) not in named
        }
        ahead = self._counts_ahead_routing(lg, res, named) if self.n > 1 else {}
        self.env = env
        for j in self._op_order(lg, res, named, ahead):
            op, dec = lg.ops[j], res.decisions[j]
            w = shard.ops[(i, op.name)]
            if self._wrong_slices(op, dec, env, planned):
                # Forced only: column-parallel weight on the rank's own tokens, slices gathered by token.
                local = K.linear(env[op.inputs[0]].t, w["weight"], w.get("bias"))
                name = f"{op.output}(forced)"
                env[op.output] = Held(self.comm.all_gather_tokens(local, name, tokens, planned=False), S_COL)
                continue
            received = []
            for v, want in zip(op.inputs, dec.inputs_received, strict=True):
                held = env[v]
                if held.pl != want:
                    held = self._convert(lg, op, dec, v, held, want, named, done, tokens)
                received.append(held)
            ins = []
            for v, held, need in zip(op.inputs, received, dec.strategy.inputs, strict=True):
                if held.pl != need:
                    held = self._convert(lg, op, dec, v, held, need, named, done, tokens)
                ins.append(held)
            state = self.state.ops.setdefault((i, op.name), {})
            span = self.observer.open("op", i, op.name) if self.observer else None
            env[op.output] = self._run(op, dec, ins, w, state, ctx, tokens)
            if self.observer:
                self.observer.close(span)
            if op.output in ahead:
                self._exchange_counts_ahead(ahead[op.output], env[op.output].t, tokens)
            if boundary and op_kind(op.kind).reads_bank and op in lg.entry:
                self._snapshot(op, env, done, tokens)

    def _snapshot(self, op: Op, env: dict[str, Held], done: dict[tuple[str, Placement], Held], tokens: int) -> None:
        """A block boundary: the running prefix the AttnRes just read is frozen into the bank, in the
        bank's placement (the gathered prefix where the bank is on every row and the stream is not),
        and the prefix restarts from zero in every form this layer holds it."""
        stream = str(op.attrs.get("norm_of", op.inputs[1]))
        bank, held = env["bank"], env[stream]
        snap = held if held.pl is bank.pl else done.get((stream, bank.pl))
        if snap is None and (held.pl, bank.pl) == (R, S_TOK):
            snap = Held(RUNTIME_TRANSITIONS[(R, S_TOK)](Move(self.comm, stream, 0, tokens), held.t), S_TOK)
        if snap is None:
            raise PlanViolation(f"layer {self.tracer.layer}: the bank is {bank.pl} but `{stream}` is only {held.pl}")
        env["bank"] = Held(torch.cat([bank.t, snap.t[:, None, :]], dim=1), bank.pl)
        env[stream] = Held(torch.zeros_like(held.t), held.pl)
        for key in [k for k in done if k[0] == stream]:
            done[key] = Held(torch.zeros_like(done[key].t), done[key].pl)

    def _wrong_slices(self, op: Op, dec: OpDecision, env: dict[str, Held], planned: set[tuple[str, Placement]]) -> bool:
        """True where a forced run (verify --force) replaces the repair's input all-gather by the wrong slice gather."""
        if self.exec_plan is self.plan or not op_kind(op.kind).linear or dec.split != WeightSplit.COL:
            return False
        v = op.inputs[0]
        return env[v].pl is S_TOK and (v, R) not in planned

    def _convert(
        self, lg: LayerGraph, op: Op, dec: OpDecision, v: str, held: Held, dst: Placement,
        named: dict[tuple[str, Placement], CommEvent], done: dict[tuple[str, Placement], Held], tokens: int,
    ) -> Held:  # fmt: skip
        """Bring `held` (value `v`) to `dst`: a free local step or a collective the plan names."""
        key = (v, dst)
        if key in done:
            return done[key]
        src = held.pl
        value = lg.values.get(v)
        move = transition(src, dst)
        out: Held | None = None
        if (src, dst) == (S_TOK, P) and dec.strategy.output is R and op.reduces_into_stream:
            # A folded residual add (the plan's `fold`): my rows of the stream, zeros elsewhere.
            lo, hi = token_range(tokens, self.n, self.rank)
            folded = held.t.new_zeros(tokens, *held.t.shape[1:])
            folded[lo:hi] = held.t[: hi - lo]
            out = Held(folded, P)
        elif move is not None and (move.free or key in named):
            m = Move(self.comm, v, value.heads if value is not None else 0, tokens, key in self._planned,
                     v in self._reduce_inplace, self._layout)  # fmt: skip
            call = RUNTIME_TRANSITIONS[(src, dst)]
            if key in named:  # DP attention's SUM_LEN: the same placements moved by an all-reduce
                call = RUNTIME_DP_TRANSITIONS.get((src, dst, named[key].collective), call)
            out = Held(call(m, held.t), dst)
        if out is None:
            raise PlanViolation(
                f"layer {self.tracer.layer} {op.name}: `{v}` is {src} but needs {dst}, and plan "
                f"'{self.plan.name}' names no collective for it"
            )
        done[key] = out
        return out

    def _layout(self, name: str, copy: Callable[..., Tensor], *args: Any) -> Tensor:
        """One layout copy before or after a collective (`pack:<value>`, `unpack:<value>`), run as a
        step of its own so the collective call gets (or returns) the ready buffer; an observer sees it
        as a "copy" span (a benchmark times it as an op); `tracer.copies` lists them."""
        self.tracer.copies.append((self.tracer.chunk, self.tracer.layer, name))
        if self.observer is None:
            return copy(*args)
        span = self.observer.open("copy", self.tracer.layer, name)
        out = copy(*args)
        self.observer.close(span)
        return out

    def _run(
        self, op: Op, dec: OpDecision, ins: list[Held], w: dict[str, Tensor], state: dict[str, Any],
        ctx: ExecContext, tokens: int,
    ) -> Held:  # fmt: skip
        tensors = [h.t for h in ins]
        if op_kind(op.kind).mixes_tokens and self.context_parallel is not None:
            return Held(self.context_parallel.mix(self, op, tensors, w, ctx), dec.strategy.output)
        if op_kind(op.kind).routed_experts and dec.split == "a2a" and self.n > 1:
            return Held(self._moe_a2a(op, tensors[0], tensors[1], w, tokens), S_TOK)
        if op_kind(op.kind).mixes_tokens and dec.strategy.output is S_TOK:
            return Held(self._mix_own_requests(op, tensors, w, state, ctx, tokens), S_TOK)
        if op_kind(op.kind).routed_experts and dec.split == "ep" and self.n > 1:
            owned, _, _ = expert_ownership(op.int_attr("experts"), "ep", self.n, self.rank, self.plan.ep_size)
            tensors = [tensors[0], tensors[1][:, owned.start : owned.stop]]
        if op.reduces_into_stream and dec.strategy.output is R and all(p is P for p in dec.strategy.inputs):
            # A folded residual add: one all-reduce of (block output + my stream rows) over every row.
            total = execute_op(op, tensors, w, state, ctx)
            planned = (op.output, R) in self._planned
            return Held(self.comm.all_reduce(total, op.output, planned=planned, inplace=True), R)
        return Held(execute_op(op, tensors, w, state, ctx), dec.strategy.output)

    def _mix_own_requests(
        self, op: Op, tensors: list[Tensor], w: dict[str, Tensor], state: dict[str, Any], ctx: ExecContext,
        tokens: int,
    ) -> Tensor:  # fmt: skip
        """DP attention: a token mixer over this rank's own request only, its real rows at the
        request's own positions (padding rows stay out of the KV cache and the recurrent state)."""
        lo, hi = token_range(tokens, self.n, self.rank)
        rows, real = tensors[0].shape[0], hi - lo
        width = ctx.values[op.output].width
        out = tensors[0].new_zeros(rows, width)
        if real:
            pos = torch.arange(self.dp_position, self.dp_position + real, device=self.device)
            out[:real] = execute_op(op, [x[:real] for x in tensors], w, state, replace(ctx, positions=pos))
        return out

    def _counts_ahead_routing(
        self, lg: LayerGraph, res: LayerResult, named: dict[tuple[str, Placement], CommEvent]
    ) -> dict[str, Op]:
        """Routing values whose all-to-all MoE can exchange its send counts right after the router.

        The counts must reach the host before the dispatch is launched, and after that host sync the
        GPU idles while the CPU launches the dispatch (70-200 us on 2xH200, docs/runtime.md). Exchanged
        as soon as the routing exists, the counts travel while the ops between router and experts
        (K3: the latent down-projection) run, and the host waits only for them. Only where those ops
        issue no collective, so the traced order stays the predicted one (counts, dispatch, combine)."""
        out: dict[str, Op] = {}
        index = {op.output: j for j, op in enumerate(lg.ops)}
        converted = {v for v, _ in named}  # values a collective brings to some placement
        for j, (op, dec) in enumerate(zip(lg.ops, res.decisions, strict=True)):
            if not op_kind(op.kind).routed_experts or dec.split != "a2a":
                continue
            routing = op.inputs[1]
            start = index.get(routing)
            # the router's own output must be the rank's rows: from R (stream R, slice taken at the experts)
            # its first rows are rank 0's, and the counts would be every rank's tokens (issue 35)
            if (
                start is None
                or dec.strategy.inputs[1] is not S_TOK
                or res.decisions[start].strategy.output is not S_TOK
            ):
                continue
            if not any(converted & set(o.inputs) for o in lg.ops[start + 1 : j + 1]):
                out[routing] = op
        return out

    @staticmethod
    def _op_order(
        lg: LayerGraph, res: LayerResult, named: dict[tuple[str, Placement], CommEvent], ahead: dict[str, Op]
    ) -> list[int]:
        """The layer's ops in graph order, except that before an all-to-all MoE (one in `ahead`) come
        the later ops that do not depend on it and issue no collective (K3: the shared expert).

        The dispatch launch costs the CPU ~300 us (an uneven `all_to_all_single`, on 2xH200); in graph
        order the GPU has run dry by then and waits (the in-plan dispatch measured 2.5x its replay).
        With the shared expert's GEMMs queued first, the GPU computes while the CPU launches, as
        serving engines overlap them. Same ops on the same inputs, same collectives in the same order.
        """
        order = list(range(len(lg.ops)))
        if not ahead:
            return order
        moe_ops = {id(op) for op in ahead.values()}
        for j, op in enumerate(lg.ops):
            if id(op) not in moe_ops:
                continue
            tainted = {op.output} | {v for v, _ in named}  # fed by the MoE, or by a collective
            movable = []
            for k in range(j + 1, len(lg.ops)):
                later = lg.ops[k]
                if tainted & set(later.inputs) or op_kind(later.kind).reads_bank:
                    tainted.add(later.output)
                else:
                    movable.append(k)
            rest = [k for k in order if k not in movable]
            at = rest.index(j)
            order = rest[:at] + movable + rest[at:]
        return order

    def _exchange_counts_ahead(self, op: Op, routing: Tensor, tokens: int) -> None:
        """Start the MoE count exchange now and copy the counts to pinned host memory without waiting;
        `_moe_a2a` picks them up (see `_counts_ahead_routing`)."""
        hit, counts = self._moe_hits(op, routing, tokens)
        got = self.comm.exchange_counts(counts, f"{op.inputs[0]}:counts")
        pinned = routing.device.type == "cuda"
        host = torch.empty(2, self.n, dtype=torch.int64, pin_memory=pinned)
        host.copy_(torch.stack([counts, got]), non_blocking=pinned)
        ready = None
        if pinned:
            ready = torch.cuda.Event()
            ready.record()
        self._counts_ahead[op.inputs[0]] = (hit, host, ready)

    def _moe_hits(self, op: Op, routing: Tensor, tokens: int) -> tuple[Tensor, Tensor]:
        """[real, n] mask (token t goes to rank j) and the per-rank send counts, on the device."""
        n = self.n
        per = op.int_attr("experts") // n
        lo, hi = token_range(tokens, n, self.rank)
        hit = (routing[: hi - lo].reshape(hi - lo, n, per) != 0).any(-1)
        return hit, hit.sum(0)

    def _moe_a2a(self, op: Op, x: Tensor, routing: Tensor, w: dict[str, Tensor], tokens: int) -> Tensor:
        """Dispatch each real token once to every rank hosting one of its experts, run the local experts,
        combine (sum) the returned rows. Padding rows are not sent."""
        n, c = self.n, self.comm
        name = op.inputs[0]
        experts = op.int_attr("experts")
        per = experts // n
        lo, hi = token_range(tokens, n, self.rank)
        real = hi - lo
        weights = routing[:real].reshape(real, n, per)  # [real, n, per]: each rank's experts' weights
        before_collective(self.rank, "all_to_all")
        ahead = self._counts_ahead.pop(name, None)
        if ahead is not None:  # exchanged right after the router: wait for those counts only
            hit, host, ready = ahead
            if ready is not None:
                ready.synchronize()
            send, recv = host.tolist()
        else:
            hit, counts = self._moe_hits(op, routing, tokens)  # [real, n] mask and send counts, on the device
            got_counts = c.exchange_counts(counts, f"{name}:counts")
            # The layer's one host sync: send and receive counts in one read. After a sync the GPU is idle
            # and every launch that follows is exposed (docs/runtime.md), so nothing else here syncs.
            send, recv = torch.stack([counts, got_counts]).tolist()
        # Rows grouped by destination rank in rank order, tokens ascending within each: nonzero over
        # the [n, real] mask, sized by the counts already on the host (no second sync).
        dst, tok = torch.nonzero_static(hit.t(), size=sum(send)).unbind(1)
        # One dispatch launch: the rows' fp32 combine weights ride in the same buffer as extra columns.
        got = c.all_to_all_rows(pack_rows(x[tok], weights[tok, dst]), send, recv, f"{name}:dispatch")
        got_x, got_w = unpack_rows(got, x.shape[1])
        y = run_experts(op, got_x, got_w, w, K)
        back = c.all_to_all_rows(y, recv, send, f"{name}:combine")
        out = torch.zeros_like(x)
        out.index_add_(0, tok, back.to(out.dtype))
        return out


def pack_rows(rows: Tensor, weights: Tensor) -> Tensor:
    """[rows | weights] in rows' dtype: the float32 `weights` [R, k] bit-reinterpreted as
    4/itemsize columns each (2 in bf16/fp16, 1 in fp32), so they travel exactly in one buffer."""
    bits = weights.float().contiguous().view(rows.dtype)
    return torch.cat([rows, bits], dim=1)


def unpack_rows(packed: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Inverse of `pack_rows`: the first `width` columns and the float32 weights, bit for bit."""
    return packed[:, :width], packed[:, width:].contiguous().view(torch.float32)


def _repaired(graph: ModelGraph, plan: Plan, n: int) -> Plan:
    """The illegal `plan` made legal by all-gathers: the placements a forced run follows."""
    fixed = repair(graph, plan, n, "gather", plan.name, plan.title, plan.summary)
    if not audit_plan(graph, fixed, n, "fp32").legal:
        raise TpplanError(f"plan={plan.name} force=", "no all-gather repair makes this plan runnable", "")
    return fixed


def full_value(comm: Comm, held: Held, value_heads: int, tokens: int) -> Tensor:
    """Verification only (untraced): the full [T, ...] true value of a local value in any placement."""
    if held.pl is R:
        return held.t[:tokens]
    if held.pl is S_TOK:
        return comm.gather_full_tokens(held.t, tokens)
    if held.pl is P:
        return comm.sum_full(held.t)
    return comm.gather_full_heads(held.t, value_heads)


__all__ = ["Held", "PlanRunner", "PlanViolation", "check_legal", "full_value", "make_comm", "pack_rows", "unpack_rows"]
