"""Execute a context-parallel deployment for real on torch.distributed: CP N ranks of TP 1
(`CpRunner`), or TP x CP (`TpCpHook` in each TP group's `PlanRunner`); `--cp-layers mla` in
`context_parallel_mla`, the checks against the one-process model in `context_parallel_verify`.

Each rank holds its share of one sequence's tokens, as `tpplan.layout.context_parallel` splits
them (zigzag chunks i and 2N-1-i for softmax-attention models, contiguous for linear attention),
with the whole model's weights, and walks every layer's graph with the single-process kernels
(`executor.execute_op`) on its own rows. Only token mixers see other ranks' tokens, exactly as the
planner's `CpExchange`s say:

- GQA: this rank's K and V (one tensor, K beside V) are all-gathered over the CP group, padded to
  the longest rank; MLA: the normed KV latent beside the rope key (kv_lora + rope wide), and every
  rank up-projects the gathered latent with `kv_b_proj` itself;
- KDA / Gated DeltaNet: the serial hand-off: rank r receives rank r-1's final recurrent state
  (GDN: and its conv tail, the halo) in the kernel's own chunked-prefill state, runs its chunk and
  sends its state on; KDA's separate short convolutions receive the previous rank's last
  conv_kernel-1 inputs (the halo; posted at once by every rank, no chain). With
  `recurrence="scan"`, KDA and GDN run the two-pass scan instead (`_scan`, `_scan_gdn`): local scan,
  an all-gather of every rank's chunk state and transition, a correction pass (GDN's conv halo is
  then posted at once by every rank before its local pass, as KDA's short convs' are).

The attention call reuses the reference kernel as it is: the queries are placed at their absolute
positions in a [T, ...] buffer of zeros and the causal kernel runs over the gathered keys; rows of
other ranks' queries are discarded. That repeats attention work (the runtime checks numbers and
collectives, not speed; the cost model prices the zigzag rank's own pairs).

Every CP collective is recorded as a `CpCall` (all-gathers on every rank, sends on the receiving
rank), which must equal `lower.schedule.predict_cp_calls`: the lowered program's CP steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import Split, audit_cp, model_split, rank_positions
from tpplan.lower.schedule import CpCall
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph, Op
from tpplan.models.opkinds import mixer_of, op_kind
from tpplan.runtime import kernels as K
from tpplan.runtime.executor import (
    ExecContext,
    execute_op,
    final_hidden,
    layer_weights,
    lm_head,
    numerics_for,
    take_bank_snapshot,
)
from tpplan.runtime.weights import Numerics

_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Mixers:
    """The token mixers of one CP rank: what they exchange with the CP peers (the same rank of the
    TP group next door). Subclasses set `cp`, `rank` (the CP rank), `tp`, `group` (the CP process
    group, None for the world), `recurrence`, `positions`, `tokens`, `rows`, `full_ctx`, `calls`,
    `_layer`, and say where CP rank r sits (`_peer`) and where a layer's other op weights are."""

    cp: int
    rank: int
    tp: int = 1
    group: Any = None
    recurrence: str
    positions: list[list[int]]
    tokens: int
    rows: int
    full_ctx: ExecContext
    calls: list[CpCall]
    _layer: int

    def _peer(self, r: int) -> int:
        return r

    def _weights_of(self, op: Op) -> Mapping[str, Tensor]:
        raise NotImplementedError

    def _layout(self, tokens: int, split: Split) -> None:
        self.positions = [rank_positions(tokens, self.cp, r, split) for r in range(self.cp)]
        self.tokens, self.rows = tokens, max(len(p) for p in self.positions)

    # -- token mixers --------------------------------------------------------------------------
    def _mix(self, lg: LayerGraph, op: Op, env: Mapping[str, Tensor], ins: list[Tensor], w: Mapping[str, Tensor],
             ctx: ExecContext) -> Tensor:  # fmt: skip
        m = mixer_of(op)
        method = m.cp if m is not None else None  # the mixer's CP method (`Mixer.cp`)
        if method == "kv_all_gather":
            k, v = ins[1], ins[2]
            kv = self._gather(torch.cat([k, v], dim=1), op, f"{op.inputs[1]}+{op.inputs[2]}")
            full = [self._place(ins[0]), kv[:, : k.shape[1]], kv[:, k.shape[1] :]]
            return execute_op(op, full, w, {}, self.full_ctx)[self._mine()]
        if method == "latent_all_gather":
            kv_b = next(o for o in lg.ops if o.output == op.inputs[1])
            latent, rope = env[kv_b.inputs[0]], ins[2]
            both = self._gather(torch.cat([latent, rope], dim=1), op, f"{kv_b.inputs[0]}+{op.inputs[2]}")
            lat_full, rope_full = both[:, : latent.shape[1]], both[:, latent.shape[1] :]
            kv_full = execute_op(kv_b, [lat_full], self._weights_of(kv_b), {}, self.full_ctx)
            return execute_op(op, [self._place(ins[0]), kv_full, rope_full], w, {}, self.full_ctx)[self._mine()]
        if method == "conv_halo":
            return execute_op(op, ins, w, self._halo(op, ins[0]), ctx)
        if m is not None and method == "state" and self.recurrence == "scan":  # KDA's per-channel gate, or GDN's
            return self._scan(op, ins, w, ctx) if m.channel_gated else self._scan_gdn(op, ins, w, ctx)
        if m is not None and method == "state":
            state = self._receive_state(op, ins[0])
            out = execute_op(op, ins, w, state, ctx)
            if self.rank + 1 < self.cp:
                for key in ("recurrent", "conv"):
                    if key in state:
                        dist.send(state[key].contiguous(), self._peer(self.rank + 1))
            return out
        raise TpplanError(f"cp={self.cp}", f"{op.name} ({op.attrs.get('impl')}) has no CP execution", "run without CP")

    def _scan(self, op: Op, ins: list[Tensor], w: Mapping[str, Tensor], ctx: ExecContext) -> Tensor:
        """KDA by the two-pass scan. The delta rule is linear in (initial state, v) jointly, so
        run(S0, v) = run(0, v) + run(S0, 0): pass 1 is the local scan from a zero state (output and
        final state S_loc) and the chunk's transition P = run(I, 0)'s final state (dk x dk per head);
        every rank's (S_loc, P) is all-gathered, S_in(r) = P_{r-1} S_in(r-1) + S_loc_{r-1}, and the
        correction run(S_in, 0) is added to the local output."""
        q, k, v, f, beta = ins
        heads, d = op.int_attr("heads") // self.tp, op.int_attr("head_dim")
        local: dict[str, Tensor] = {}
        out = execute_op(op, ins, w, local, ctx)
        zero_v = torch.zeros_like(v)
        trans = {"recurrent": torch.eye(d, device=v.device).expand(heads, d, d).clone()}
        execute_op(op, [q, k, zero_v, f, beta], w, trans, ctx)
        parts = self._exchange_states(op, local["recurrent"], trans["recurrent"])
        if self.rank == 0:
            return out
        return out + execute_op(op, [q, k, zero_v, f, beta], w, {"recurrent": self._incoming_state(parts)}, ctx)

    def _exchange_states(self, op: Op, local: Tensor, trans: Tensor) -> list[tuple[Tensor, Tensor]]:
        """All-gather every rank's (final state from zero, chunk transition), fp32, as one flat tensor."""
        mine = torch.cat([local.reshape(-1).float(), trans.reshape(-1).float()])
        both = mine.new_empty(self.cp * mine.numel())
        self.calls.append(CpCall(self._layer, "all_gather", op.name, "state+transition", both.numel() * 4))
        _AG(both, mine.contiguous(), group=self.group)
        parts = both.view(self.cp, -1)
        n = local.numel()
        return [(p[:n].view_as(local), p[n:].view_as(trans)) for p in parts]

    def _incoming_state(self, parts: list[tuple[Tensor, Tensor]]) -> Tensor:
        """S_in(r) = P_{r-1} S_in(r-1) + S_loc_{r-1} from S_in(0) = 0, over the ranks before this one."""
        s_in = torch.zeros_like(parts[0][0])
        for s_loc, p in parts[: self.rank]:
            s_in = torch.einsum("hab,hbv->hav", p, s_in) + s_loc
        return s_in

    def _scan_gdn(self, op: Op, ins: list[Tensor], w: Mapping[str, Tensor], ctx: ExecContext) -> Tensor:
        """Gated DeltaNet by the two-pass scan. Its v sits inside the fused qkvz input, so the op is run
        in its parts (`kernels.gdn`'s own): the conv with the previous rank's halo (its last kernel-1
        pre-conv rows, sent by every rank at once), then the delta rule, which is linear in (initial
        state, v) jointly as KDA's is (`_scan`): the local pass from a zero state, the transition
        run(I, v=0) [v heads, dk, dk], the all-gather, and the correction run(S_in, v=0) added to
        the recurrence's output before the gated norm."""
        qkvz, ba = ins
        dk, dv = op.int_attr("k_head_dim"), op.int_attr("v_head_dim")
        r = op.int_attr("v_heads") // op.int_attr("k_heads")
        conv_w, eps = w["conv"], ctx.numerics.eps
        kernel = int(conv_w.shape[-1])
        conv_state: dict[str, Tensor] = {}
        if kernel > 1:  # the halo: this rank's last kernel-1 pre-conv rows go to the next rank
            if qkvz.shape[0] < kernel - 1:
                raise TpplanError(f"cp={self.cp}", f"a rank holds {qkvz.shape[0]} tokens, fewer than "
                                  f"{op.name}'s halo of {kernel - 1}", "use more tokens or a smaller CP")  # fmt: skip
            tail: dict[str, Tensor] = {}
            K.gdn_conv_inputs(qkvz[-(kernel - 1) :], ba[-(kernel - 1) :], conv_w, dk, dv, r, tail)
            reqs = []
            if self.rank + 1 < self.cp:
                reqs.append(dist.isend(tail["conv"].contiguous(), self._peer(self.rank + 1)))
            if self.rank > 0:
                buf = torch.empty_like(tail["conv"])
                reqs.append(dist.irecv(buf, self._peer(self.rank - 1)))
                conv_state["conv"] = buf
                nbytes = buf.numel() * buf.element_size()
                self.calls.append(CpCall(self._layer, "send_recv", op.name, "conv_tail", nbytes))
            for q in reqs:
                q.wait()
        qc, kc, vc, z, b, ag = K.gdn_conv_inputs(qkvz, ba, conv_w, dk, dv, r, conv_state)
        hv = b.shape[1]

        def rule(v: Tensor, state: dict[str, Tensor]) -> Tensor:
            return K.gdn_delta_rule(qc, kc, v, b, ag, w["A_log"], w["dt_bias"], r, state, 64)

        local: dict[str, Tensor] = {}
        o = rule(vc, local)
        trans = {"recurrent": torch.eye(dk, device=qkvz.device).expand(hv, dk, dk).clone()}
        rule(vc.new_zeros(vc.shape[0], hv * dk), trans)
        parts = self._exchange_states(op, local["recurrent"], trans["recurrent"])
        if self.rank > 0:
            o = o + rule(torch.zeros_like(vc), {"recurrent": self._incoming_state(parts)})
        return K.head_rms_norm(o, w["norm"], eps, dv, gate=z, gate_fn="silu").to(qkvz.dtype)

    def _mine(self) -> Tensor:
        return torch.tensor(self.positions[self.rank], dtype=torch.long)

    def _place(self, x: Tensor) -> Tensor:
        """This rank's rows at their absolute positions in a [T, W] buffer of zeros (placeholder queries)."""
        full = x.new_zeros(self.tokens, *x.shape[1:])
        full[self._mine()] = x
        return full

    def _gather(self, x: Tensor, op: Op, value: str) -> Tensor:
        """All-gather every rank's rows of `x` (padded to the longest rank), in position order [T, W]."""
        padded = torch.cat([x, x.new_zeros(self.rows - x.shape[0], *x.shape[1:])]) if x.shape[0] < self.rows else x
        out = x.new_empty(self.cp * self.rows, *x.shape[1:])
        self.calls.append(CpCall(self._layer, "all_gather", op.name, value, out.numel() * out.element_size()))
        _AG(out, padded.contiguous(), group=self.group)
        full = x.new_empty(self.tokens, *x.shape[1:])
        for r, pos in enumerate(self.positions):
            full[torch.tensor(pos, dtype=torch.long)] = out[r * self.rows : r * self.rows + len(pos)]
        return full

    def _halo(self, op: Op, x: Tensor) -> dict[str, Tensor]:
        """The short conv's state for this rank: the previous rank's last kernel-1 inputs (rank 0: none)."""
        k = op.int_attr("kernel", 1) - 1
        if k <= 0:
            return {}
        if x.shape[0] < k:
            raise TpplanError(f"cp={self.cp}", f"a rank holds {x.shape[0]} tokens, fewer than {op.name}'s "
                              f"halo of {k}", "use more tokens or a smaller CP")  # fmt: skip
        reqs = []
        if self.rank + 1 < self.cp:
            reqs.append(dist.isend(x[-k:].contiguous(), self._peer(self.rank + 1)))
        state: dict[str, Tensor] = {}
        if self.rank > 0:
            buf = x.new_empty(k, x.shape[1])
            reqs.append(dist.irecv(buf, self._peer(self.rank - 1)))
            state["conv"] = buf
            self.calls.append(CpCall(self._layer, "send_recv", op.name, op.inputs[0], buf.numel() * buf.element_size()))
        for r in reqs:
            r.wait()
        return state

    def _receive_state(self, op: Op, like: Tensor) -> dict[str, Tensor]:
        """Rank r-1's final state (and GDN's conv tail), as the kernel keeps it between chunks."""
        if self.rank == 0:
            return {}
        tp = self.tp
        shapes: dict[str, tuple[tuple[int, ...], Any]]
        m = mixer_of(op)
        assert m is not None and m.state_dims is not None  # a recurrence handing on its state
        (heads, dk, dv), conv = m.state_dims(op), m.inner_conv_channels(op)
        shapes = {"recurrent": ((heads // tp, dk, dv), torch.float32)}
        if conv and op.int_attr("kernel", 1) > 1:  # GDN's conv tail, run inside the op
            shapes["conv"] = ((op.int_attr("kernel") - 1, conv // tp), like.dtype)
        state: dict[str, Tensor] = {}
        for key, (shape, dt) in shapes.items():
            buf = torch.empty(shape, dtype=dt, device=like.device)
            dist.recv(buf, self._peer(self.rank - 1))
            value = "state" if key == "recurrent" else "conv_tail"
            self.calls.append(CpCall(self._layer, "send_recv", op.name, value, buf.numel() * buf.element_size()))
            state[key] = buf
        return state


class CpRunner(_Mixers):
    """One CP rank of `mesh`: TP 1 x CP, or (`cp_layers="mla"`, `context_parallel_mla.py`) TP = CP,
    attention TP 1 (the default process group is the CP group)."""

    def __init__(
        self,
        graph: ModelGraph,
        mesh: Mesh,
        rank: int,
        weights: Mapping[str, Tensor],
        *,
        numerics: Numerics | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.graph, self.cp, self.rank, self.recurrence = graph, mesh.cp, rank, mesh.cp_recurrence
        if mesh.tp != (mesh.cp if mesh.cp_layers == "mla" else 1):
            raise TpplanError(mesh.fields(), "a CP rank runs TP 1 (cp_layers=mla: TP = CP, attention TP 1)",
                              "use TpCpHook for TP x CP")  # fmt: skip
        self.audit = audit_cp(graph, mesh)
        if not self.audit.legal:
            raise TpplanError(f"cp={mesh.cp}", "; ".join(self.audit.reasons), "run this model without CP")
        self.split = model_split(self.audit)
        self.nu = numerics or numerics_for(graph)
        dev = device or torch.device("cpu")
        self.w = {k: v.to(device=dev, dtype=dtype) for k, v in weights.items()}
        self.resolved = {
            (i, op.name): layer_weights(op, i, self.w, self.nu)
            for i, kind in enumerate(graph.layer_kinds)
            for op in graph.kinds[kind].ops
        }
        self.calls: list[CpCall] = []
        self._layer = 0

    def _weights_of(self, op: Op) -> Mapping[str, Tensor]:
        return self.resolved[(self._layer, op.name)]

    # -- the forward ---------------------------------------------------------------------------
    def prefill(self, ids: Tensor) -> tuple[Tensor, list[int]]:
        """This rank's final normed hidden rows of one sequence `ids` and the positions they hold."""
        ids = ids.reshape(-1)
        t = ids.numel()
        self._layout(t, self.split)
        mine = self.positions[self.rank]
        pos = torch.tensor(mine, dtype=torch.long, device=ids.device)
        nu = self.nu
        rope = K.Rope(nu.rope_theta, nu.rope_interleave, nu.rope_scaling, nu.max_position_embeddings)
        ctx = ExecContext(nu, pos, rope=rope)
        self.full_ctx = ExecContext(nu, torch.arange(t, device=ids.device), rope=rope)
        emb = self.w["model.embed_tokens.weight"][ids[pos]] * nu.embed_scale
        resid, delta = emb, torch.zeros_like(emb)
        block = self.graph.spec.attn_res_block_size
        bank = emb.new_zeros(len(mine), 0, emb.shape[1])
        for i, kind in enumerate(self.graph.layer_kinds):
            lg = self.graph.kinds[kind]
            self._layer = ctx.layer = self.full_ctx.layer = i
            ctx.values = self.full_ctx.values = lg.values
            env: dict[str, Tensor] = {"resid": resid, "delta": delta, "bank": bank}
            for op in lg.ops:
                w = self.resolved[(i, op.name)]
                if op_kind(op.kind).mixes_tokens:
                    out = self._mix(lg, op, env, [env[n] for n in op.inputs], w, ctx)
                else:
                    out = execute_op(op, [env[n] for n in op.inputs], w, {}, ctx)
                env[op.output] = out
                bank = take_bank_snapshot(op, lg, env, bank, block, i)
            resid = env[lg.middle_add.output]
            delta = env["mlp_out"]
        return final_hidden(self.w, nu, resid, delta, bank, block), mine

    def logits(self, hidden: Tensor) -> Tensor:
        return K.linear(hidden, lm_head(self.w))


class TpCpHook(_Mixers):
    """TP x CP of `mesh`: one TP group's `PlanRunner` (its own process group) on its CP rank's tokens,
    its token mixers reaching the same TP rank of the other CP groups (`PlanRunner.context_parallel`).
    World rank = cp_rank * tp + tp_rank; `groups` from `cp_groups`."""

    def __init__(self, graph: ModelGraph, mesh: Mesh, world_rank: int, cp_group: Any, tokens: int,
                 numerics: Numerics) -> None:  # fmt: skip
        tp = mesh.tp
        self.graph, self.tp, self.cp, self.recurrence = graph, tp, mesh.cp, mesh.cp_recurrence
        self.rank, self.tp_rank = divmod(world_rank, tp)
        self.group = cp_group
        self.audit = audit_cp(graph, mesh)
        if not self.audit.legal:
            raise TpplanError(f"cp={mesh.cp}", "; ".join(self.audit.reasons), "run this model without CP")
        self.split = model_split(self.audit)
        self._layout(tokens, self.split)
        nu = numerics
        rope = K.Rope(nu.rope_theta, nu.rope_interleave, nu.rope_scaling, nu.max_position_embeddings)
        self.full_ctx = ExecContext(nu, torch.arange(tokens), rope=rope, tp=tp)
        self.calls = []
        self._layer = 0
        self._runner: Any = None

    def _peer(self, r: int) -> int:
        return r * self.tp + self.tp_rank

    def _weights_of(self, op: Op) -> Mapping[str, Tensor]:
        return self._runner.shard.ops[(self._layer, op.name)]

    def own_positions(self, tokens: int) -> Tensor:
        mine = self.positions_of_rank()
        if tokens != len(mine):
            raise TpplanError("chunk=", "chunked prefill under CP is not executed", "run the prompt in one chunk")
        return torch.tensor(mine, dtype=torch.long)

    def positions_of_rank(self) -> list[int]:
        return self.positions[self.rank]

    def mix(self, runner: Any, op: Op, tensors: list[Tensor], w: dict[str, Tensor], ctx: ExecContext) -> Tensor:
        self._runner, self._layer = runner, ctx.layer
        self.full_ctx.layer, self.full_ctx.values = ctx.layer, ctx.values
        lg = self.graph.kinds[self.graph.layer_kinds[ctx.layer]]
        env = {k: h.t for k, h in runner.env.items()}
        return self._mix(lg, op, env, tensors, w, ctx)


def cp_groups(mesh: Mesh, world_rank: int) -> tuple[Any, Any]:
    """(this rank's TP group, its CP group) of `mesh`; every rank creates every group, in the same order."""
    tp, cp = mesh.tp, mesh.cp
    tp_groups = [dist.new_group(list(range(c * tp, (c + 1) * tp))) for c in range(cp)]
    cp_groups_ = [dist.new_group([c * tp + t for c in range(cp)]) for t in range(tp)]
    c, t = divmod(world_rank, tp)
    return tp_groups[c], cp_groups_[t]


__all__ = ["CpRunner", "TpCpHook", "cp_groups"]
