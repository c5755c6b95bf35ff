"""Execute a context-parallel deployment for real: CP N ranks (TP 1 inside each), on torch.distributed.

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
  `recurrence="scan"`, KDA runs the two-pass scan instead (`CpRunner._scan`): local scan, an
  all-gather of every rank's chunk state and transition, a correction pass (GDN: serial only).

The attention call reuses the reference kernel as it is: the queries are placed at their absolute
positions in a [T, ...] buffer of zeros and the causal kernel runs over the gathered keys; rows of
other ranks' queries are discarded. That repeats attention work (the runtime checks numbers and
collectives, not speed; the cost model prices the zigzag rank's own pairs).

Every CP collective is recorded as a `CpCall` (all-gathers on every rank, sends on the receiving
rank), which must equal `layout.context_parallel.cp_calls`, the planner's prediction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import CpCall, audit_cp, model_split, rank_positions
from tpplan.models.graph import LayerGraph, ModelGraph, Op, OpKind
from tpplan.runtime import kernels as K
from tpplan.runtime.executor import ExecContext, execute_op, layer_weights, numerics_for
from tpplan.runtime.weights import Numerics

_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CpRunner:
    """One CP rank of a TP 1 x CP `cp` deployment (the default process group is the CP group)."""

    def __init__(
        self,
        graph: ModelGraph,
        cp: int,
        rank: int,
        weights: Mapping[str, Tensor],
        *,
        numerics: Numerics | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        recurrence: str = "serial",
    ) -> None:
        self.graph, self.cp, self.rank, self.recurrence = graph, cp, rank, recurrence
        self.audit = audit_cp(graph, 1, cp, recurrence)  # type: ignore[arg-type]
        if not self.audit.legal:
            raise TpplanError(f"--cp {cp}", "; ".join(self.audit.reasons), "run this model without CP")
        if recurrence == "scan" and any(op.attrs.get("impl") == "gdn" for lg in graph.kinds.values() for op in lg.ops):
            raise TpplanError("--cp-recurrence scan", "the two-pass scan is executed for KDA only (GDN's v sits "
                              "inside its fused input)", "pass --cp-recurrence serial")  # fmt: skip
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

    # -- the forward ---------------------------------------------------------------------------
    def prefill(self, ids: Tensor) -> tuple[Tensor, list[int]]:
        """This rank's final normed hidden rows of one sequence `ids` and the positions they hold."""
        ids = ids.reshape(-1)
        t = ids.numel()
        self.positions = [rank_positions(t, self.cp, r, self.split) for r in range(self.cp)]
        mine = self.positions[self.rank]
        self.tokens, self.rows = t, max(len(p) for p in self.positions)
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
                if op.kind is OpKind.TOKEN_MIX:
                    out = self._mix(lg, op, env, w, ctx)
                else:
                    out = execute_op(op, [env[n] for n in op.inputs], w, {}, ctx)
                env[op.output] = out
                if op.kind is OpKind.ATTN_RES and op in lg.entry and block and i % block == 0:
                    stream = str(op.attrs.get("norm_of", op.inputs[1]))
                    bank = torch.cat([bank, env[stream][:, None, :]], dim=1)
                    env["bank"] = bank
                    env[stream] = torch.zeros_like(env[stream])
            resid = env[next(op.output for op in lg.middle if op.kind is OpKind.ADD)]
            delta = env["mlp_out"]
        final = resid + delta
        if block:
            final = K.attn_res(final, bank, self.w["model.output_attn_res_proj.weight"],
                               self.w["model.output_attn_res_norm.weight"], nu.eps)  # fmt: skip
        return K.rms_norm(final, self.w["model.norm.weight"], nu.eps, nu.norm_offset), mine

    def logits(self, hidden: Tensor) -> Tensor:
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return K.linear(hidden, head)

    # -- token mixers --------------------------------------------------------------------------
    def _mix(self, lg: LayerGraph, op: Op, env: dict[str, Tensor], w: Mapping[str, Tensor], ctx: ExecContext) -> Tensor:
        impl = str(op.attrs.get("impl"))
        ins = [env[n] for n in op.inputs]
        if impl == "gqa":
            k, v = ins[1], ins[2]
            kv = self._gather(torch.cat([k, v], dim=1), op, f"{op.inputs[1]}+{op.inputs[2]}")
            full = [self._place(ins[0]), kv[:, : k.shape[1]], kv[:, k.shape[1] :]]
            return execute_op(op, full, w, {}, self.full_ctx)[self._mine()]
        if impl == "mla":
            kv_b = next(o for o in lg.ops if o.output == op.inputs[1])
            latent, rope = env[kv_b.inputs[0]], ins[2]
            both = self._gather(torch.cat([latent, rope], dim=1), op, f"{kv_b.inputs[0]}+{op.inputs[2]}")
            lat_full, rope_full = both[:, : latent.shape[1]], both[:, latent.shape[1] :]
            kv_full = execute_op(kv_b, [lat_full], self.resolved[(self._layer, kv_b.name)], {}, self.full_ctx)
            return execute_op(op, [self._place(ins[0]), kv_full, rope_full], w, {}, self.full_ctx)[self._mine()]
        if impl == "short_conv":
            return execute_op(op, ins, w, self._halo(op, ins[0]), ctx)
        if impl == "kda" and self.recurrence == "scan":
            return self._scan(op, ins, w, ctx)
        if impl in ("kda", "gdn"):
            state = self._receive_state(op, ins[0])
            out = execute_op(op, ins, w, state, ctx)
            if self.rank + 1 < self.cp:
                for key in ("recurrent", "conv"):
                    if key in state:
                        dist.send(state[key].contiguous(), self.rank + 1)
            return out
        raise TpplanError(f"--cp {self.cp}", f"{op.name} ({impl}) has no CP execution", "run without CP")

    def _scan(self, op: Op, ins: list[Tensor], w: Mapping[str, Tensor], ctx: ExecContext) -> Tensor:
        """KDA by the two-pass scan. The delta rule is linear in (initial state, v) jointly, so
        run(S0, v) = run(0, v) + run(S0, 0): pass 1 is the local scan from a zero state (output and
        final state S_loc) and the chunk's transition P = run(I, 0)'s final state (dk x dk per head);
        every rank's (S_loc, P) is all-gathered, S_in(r) = P_{r-1} S_in(r-1) + S_loc_{r-1}, and the
        correction run(S_in, 0) is added to the local output."""
        q, k, v, f, beta = ins
        heads, d = int(op.attrs["heads"]), int(op.attrs["head_dim"])
        local: dict[str, Tensor] = {}
        out = execute_op(op, ins, w, local, ctx)
        zero_v = torch.zeros_like(v)
        trans = {"recurrent": torch.eye(d, device=v.device).expand(heads, d, d).clone()}
        execute_op(op, [q, k, zero_v, f, beta], w, trans, ctx)
        mine = torch.cat([local["recurrent"].reshape(-1), trans["recurrent"].reshape(-1).float()])
        both = mine.new_empty(self.cp * mine.numel())
        self.calls.append(CpCall(self._layer, "all_gather", op.name, "state+transition", both.numel() * 4))
        _AG(both, mine.contiguous())
        parts = both.view(self.cp, 2, heads, d, d)
        s_in = torch.zeros(heads, d, d, device=v.device)
        for j in range(self.rank):
            s_in = torch.einsum("hab,hbv->hav", parts[j, 1], s_in) + parts[j, 0]
        if self.rank == 0:
            return out
        return out + execute_op(op, [q, k, zero_v, f, beta], w, {"recurrent": s_in}, ctx)

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
        _AG(out, padded.contiguous())
        full = x.new_empty(self.tokens, *x.shape[1:])
        for r, pos in enumerate(self.positions):
            full[torch.tensor(pos, dtype=torch.long)] = out[r * self.rows : r * self.rows + len(pos)]
        return full

    def _halo(self, op: Op, x: Tensor) -> dict[str, Tensor]:
        """The short conv's state for this rank: the previous rank's last kernel-1 inputs (rank 0: none)."""
        k = int(op.attrs.get("kernel", 1)) - 1
        if k <= 0:
            return {}
        if x.shape[0] < k:
            raise TpplanError(f"--cp {self.cp}", f"a rank holds {x.shape[0]} tokens, fewer than {op.name}'s "
                              f"halo of {k}", "use more tokens or a smaller CP")  # fmt: skip
        reqs = []
        if self.rank + 1 < self.cp:
            reqs.append(dist.isend(x[-k:].contiguous(), self.rank + 1))
        state: dict[str, Tensor] = {}
        if self.rank > 0:
            buf = x.new_empty(k, x.shape[1])
            reqs.append(dist.irecv(buf, self.rank - 1))
            state["conv"] = buf
            self.calls.append(CpCall(self._layer, "send_recv", op.name, op.inputs[0], buf.numel() * buf.element_size()))
        for r in reqs:
            r.wait()
        return state

    def _receive_state(self, op: Op, like: Tensor) -> dict[str, Tensor]:
        """Rank r-1's final state (and GDN's conv tail), as the kernel keeps it between chunks."""
        if self.rank == 0:
            return {}
        a = op.attrs
        if a["impl"] == "kda":
            shapes = {"recurrent": ((int(a["heads"]), int(a["head_dim"]), int(a["head_dim"])), torch.float32)}
        else:
            dk, dv, kh, vh = int(a["k_head_dim"]), int(a["v_head_dim"]), int(a["k_heads"]), int(a["v_heads"])
            shapes = {"recurrent": ((vh, dk, dv), torch.float32)}
            if int(a.get("kernel", 1)) > 1:
                shapes["conv"] = ((int(a["kernel"]) - 1, 2 * kh * dk + vh * dv), like.dtype)
        state: dict[str, Tensor] = {}
        for key, (shape, dt) in shapes.items():
            buf = torch.empty(shape, dtype=dt, device=like.device)
            dist.recv(buf, self.rank - 1)
            value = "state" if key == "recurrent" else "conv_tail"
            self.calls.append(CpCall(self._layer, "send_recv", op.name, value, buf.numel() * buf.element_size()))
            state[key] = buf
        return state


def _worker(rank: int, world: int, device: Any, payload: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Every case of `verify_cp` on this rank."""
    torch.set_num_threads(1)
    return [_case(rank, world, device, case) for case in payload]


def _case(rank: int, world: int, device: Any, payload: dict[str, Any]) -> dict[str, Any] | None:
    """One case on one rank: run, then gather every rank's rows and trace to rank 0 (untraced)."""
    from tpplan.layout.context_parallel import cp_calls
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.weights import load_safetensors, random_weights

    graph = build_model_graph(load_model(payload["model"]))
    nu = numerics_for(graph)
    path = payload.get("weights")
    weights = load_safetensors(path, graph, nu) if path else random_weights(graph, nu, seed=payload["seed"])
    ids = torch.randint(0, graph.spec.vocab, (payload["tokens"],),
                        generator=torch.Generator().manual_seed(payload["seed"] + 1))  # fmt: skip
    runner = CpRunner(graph, world, rank, weights, numerics=nu, device=device, recurrence=payload["recurrence"])
    hidden, mine = runner.prefill(ids)
    logits = runner.logits(hidden)
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, (mine, hidden, logits, runner.calls))
    if rank != 0:
        return None
    t = ids.numel()
    full_h = torch.empty(t, hidden.shape[1])
    full_l = torch.empty(t, logits.shape[1])
    for pos, h, lg, _ in parts:
        full_h[pos], full_l[pos] = h, lg
    ref_h = run_reference(graph, weights, ids, numerics=nu, return_hidden=True)
    ref_l = run_reference(graph, weights, ids, numerics=nu)
    b = torch.empty((), dtype=torch.float32).element_size()
    predicted = [cp_calls(graph, runner.audit, t, b, r) for r in range(world)]
    return {
        "model": payload["model"],
        "ids": ids,
        "hidden": full_h,
        "logits": full_l,
        "max_abs_hidden": (full_h - ref_h).abs().max().item(),
        "max_rel_logits": ((full_l - ref_l).abs().max() / ref_l.abs().max()).item(),
        "traced": [p[3] for p in parts],
        "predicted": predicted,
        "split": runner.split,
    }


def verify_cp(models: list[str], cp: int, *, tokens: int = 16, seed: int = 0, weights: dict[str, str] | None = None,
              timeout_s: float = 120.0, recurrence: str = "serial") -> list[dict[str, Any]]:  # fmt: skip
    """Run each of `models` at CP `cp` on `cp` local gloo ranks (one group for all) and compare with
    the one-process reference: the assembled final hidden and logits, and every rank's traced CP
    calls against `cp_calls`. `weights`: per model, a safetensors folder instead of random weights."""
    from tpplan.runtime.group import GroupSpec, run_group

    payload = [{"model": m, "tokens": tokens, "seed": seed, "weights": (weights or {}).get(m), "recurrence": recurrence}
               for m in models]  # fmt: skip
    return run_group(_worker, GroupSpec("gloo", cp, timeout_s), payload)


__all__ = ["CpRunner", "verify_cp"]
