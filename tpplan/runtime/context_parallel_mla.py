"""`--cp-layers mla` executed: SGLang PR #38344's full-sequence CP on `cp` gloo ranks (attention TP 1).

Every rank holds the whole sequence's hidden and all weights. KDA, MoE and every other layer run the
full sequence (in the engine with the plan's TP collectives over the group; here at TP 1 on each rank,
so the run checks the CP exchange, not those TP collectives, which `verify --tp` checks). In an MLA
layer the rank takes only its zigzag query rows (`layout.context_parallel.rank_positions`): the
attention runs those queries against K/V it expands itself for every key (nothing gathered into
attention), every op downstream of the attention inside the attention half runs on the rank's rows,
and the attention output (o_proj's rows, `layout.context_parallel.attention_output`) is all-gathered
over the CP group back to the full sequence, the one CP collective per MLA layer that the lowered
program lists (`lower.schedule.predict_cp_calls`) (padded to the longest rank, as the planner counts it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import attention_output
from tpplan.models.opkinds import mixer_of
from tpplan.runtime import kernels as K
from tpplan.runtime.context_parallel import CpRunner
from tpplan.runtime.executor import ExecContext, execute_op, final_hidden, take_bank_snapshot


class MlaOnlyCpRunner(CpRunner):
    """One rank of `--cp-layers mla` at TP = CP = `cp` (attention TP 1): the MLA attention on this rank's
    zigzag rows, everything else on the full sequence."""

    def prefill(self, ids: Tensor) -> tuple[Tensor, list[int]]:
        """The final normed hidden of every position (each rank holds them all) and those positions."""
        ids = ids.reshape(-1)
        t = ids.numel()
        self._layout(t, self.split)
        mine = torch.tensor(self.positions[self.rank], dtype=torch.long, device=ids.device)
        nu = self.nu
        rope = K.Rope(nu.rope_theta, nu.rope_interleave, nu.rope_scaling, nu.max_position_embeddings)
        self.full_ctx = ExecContext(nu, torch.arange(t, device=ids.device), rope=rope)
        own_ctx = ExecContext(nu, mine, rope=rope)
        emb = self.w["model.embed_tokens.weight"][ids] * nu.embed_scale
        resid, delta = emb, torch.zeros_like(emb)
        block = self.graph.spec.attn_res_block_size
        bank = emb.new_zeros(t, 0, emb.shape[1])
        for i, kind in enumerate(self.graph.layer_kinds):
            lg = self.graph.kinds[kind]
            sharded = self.audit.kinds[kind].split != "none"
            out_value = attention_output(lg) if sharded else None
            self._layer = own_ctx.layer = self.full_ctx.layer = i
            own_ctx.values = self.full_ctx.values = lg.values
            env: dict[str, Tensor] = {"resid": resid, "delta": delta, "bank": bank}
            local: set[str] = set()  # values this rank holds only its own rows of
            for op in lg.ops:
                w = self.resolved[(i, op.name)]
                ins = [env[n] for n in op.inputs]
                if sharded and (m := mixer_of(op)) is not None and m.cp_layers_mla:
                    q_own = self._place(ins[0][mine])  # this rank's queries; K/V of every key, expanded here
                    out = execute_op(op, [q_own, ins[1], ins[2]], w, {}, self.full_ctx)[mine]
                    local.add(op.output)
                elif local & set(op.inputs):
                    if out_value in env:  # past the gather, every op must read full rows again
                        raise TpplanError(f"cp={self.cp} cp_layers=mla", f"layer {i} ({kind}): {op.name} "
                                          "reads the rank's own rows past the attention output",
                                          "use cp_layers=all")  # fmt: skip
                    rows = [x if n in local else x[mine] for n, x in zip(op.inputs, ins, strict=True)]
                    out = execute_op(op, rows, w, {}, own_ctx)
                    local.add(op.output)
                    if op.output == out_value:  # o_proj's rows back to the full sequence over the CP group
                        out = self._gather(out, op, op.output)
                        local.discard(op.output)
                else:
                    out = execute_op(op, ins, w, {}, self.full_ctx)
                env[op.output] = out
                bank = take_bank_snapshot(op, lg, env, bank, block, i)
            resid = env[lg.middle_add.output]
            delta = env["mlp_out"]
        return final_hidden(self.w, nu, resid, delta, bank, block), list(range(t))


__all__ = ["MlaOnlyCpRunner"]
