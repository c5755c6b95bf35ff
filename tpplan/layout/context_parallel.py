"""Context parallelism (CP): the deployment's token axis, per layer kind, derived from the graph.

A deployment of TP x CP x PP ranks runs `cp` groups of `tp` ranks on every pipeline stage (rank
order stage-major, then CP, then TP: a TP group stays on consecutive GPUs, a CP group's peers sit
`tp` GPUs apart). Each CP rank holds its share of every prompt's tokens and runs the plan's TP
decisions inside its TP group on those tokens only: the plan algebra (`layout/plan.py`) is
unchanged by CP, which is why CP is a deployment argument like PP, not a plan decision. What CP
adds is, per token mixer, how attention sees the rest of the sequence (`CpExchange`):

- softmax attention (MHA/GQA, `gqa`): all-gather of K and V (the rank's TP share of the KV heads)
  over the CP group; tokens are assigned by **zigzag** chunks for causal balance: the sequence is
  cut into 2c chunks and rank i holds chunks i and 2c-1-i, so every rank computes the same number
  of causal (query, key) pairs. SGLang 0.5.23 wheel `srt/layers/cp/zigzag.py` (`ZigzagCPStrategy.
  can_apply`: at least 2 x cp tokens per sequence; `build_metadata`: 2 x cp near-equal blocks,
  `zigzag_index`; `_all_gather_reorganized`: K beside V all-gathered over the attention-CP group,
  padded to the longest rank). `layers/utils/cp_utils.py`, cited here before, is an import-only shim
  in 0.5.23 (the legacy helpers were removed);
- MLA (`mla`): all-gather of the compressed latent (kv_lora_rank + the rope key) instead of the
  up-projected K/V, the same zigzag split (SGLang `ZigzagCPStrategy.materialize_full_mla_kv`; vLLM
  0.33.0 PCP, MLA models only: `v1/attention/ops/pcp.py` `maybe_gather_mla_latent_cache_inputs`);
- linear attention (`kda`, `gdn`): contiguous chunks (rank r holds the r-th 1/c of the sequence)
  and the recurrent state handed on, either **serially** (rank r waits for rank r-1's final state:
  a chain of c local scans and c-1 sends on the critical path) or by the **two-pass scan** (local
  scan from a zero state, all-gather of every rank's chunk state and chunk transition, then a
  correction pass with the incoming state); plus the short convolution's halo: the previous
  rank's last conv_kernel-1 inputs (a send/recv). Neither engine's release has it: SGLang 0.5.23's
  strategies are zigzag and interleave only (`layers/cp/base.py` `ContextParallelStrategyKind`);
  the contiguous KDA strategy is SGLang PR #34059 (open; its description: FLA KCP's two-pass scan,
  one length-independent all-gather of the state transform per layer, a conv halo), whose code
  is not in the search index, so the payload (state + transition per head) and the correction's
  price are tpplan's;
- MLP/MoE layers run on the rank's own tokens with no CP collective (both engines differ here:
  SGLang's MLA/DSA CP and vLLM's PCP gather the FFN input over CP and run it over TP x CP ranks,
  `tpplan.engines.context_parallel`; not modelled).

This is `--cp-layers all`. `--cp-layers mla` is SGLang PR #38344's "full-sequence CP" for Kimi-K3
(open; read through its description): the CP group sits INSIDE the TP group of `tp` GPUs; only the
MLA layers' attention is token-sharded (zigzag) at attention TP width A = tp/cp, every rank holding
the full sequence's hidden and expanding K/V for every key itself (the K/V expansion, `kv_b_proj`,
replicated cp times), while KDA and MoE layers run the full sequence with the plan's TP collectives.
The plan's collective on the attention output (o_proj's all-reduce) is replaced by an all-reduce
over the A attention-TP ranks of the rank's rows (none at A = 1) and an all-gather of those rows
over the CP group (`CpKind.replaces`, `CpKind.replicated`).

A mixer without a CP method (DSA's indexer, whose top-k runs over every key) makes CP illegal
for the model: the audit says which op and why. Engine paths, gates and KV per rank:
`tpplan.engines.context_parallel` (docs/engines.md, "Prefill context parallelism").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph, Op
from tpplan.models.opkinds import mixer_of, op_kind

SGLANG_CP_UTILS = "python/sglang/srt/layers/cp/zigzag.py@0.5.23 (PyPI wheel)"  # where SGLang's zigzag CP lives
CP_SIZES = (1, 2, 4, 8)  # what the search offers
MAX_CP = 64  # the CLI's bound (commands/_bounds.py)
STATE_ELEM_BYTES = 4  # recurrent state is exchanged in fp32, as it is kept (cost.plan_steps.STATE_BYTES)

Recurrence = Literal["scan", "serial"]
CpLayers = Literal["all", "mla"]  # every layer token-sharded, or only the MLA layers (CP inside the TP group)
CP_LAYERS: tuple[CpLayers, ...] = ("all", "mla")
Method = Literal[
    "kv_all_gather",
    "latent_all_gather",
    "state_scan",
    "state_serial",
    "conv_halo",
    "output_all_gather",
    "attn_tp_all_reduce",
]
Split = Literal["zigzag", "contiguous", "none"]


@dataclass(frozen=True)
class CpExchange:
    """What one token mixer of a layer moves over the CP group, per TP rank.

    `per_token`: elements a rank contributes per token it holds (an all-gather's row width);
    `per_seq`: elements per sequence, independent of its length (a state, a halo);
    `elem_bytes`: None for the activation dtype, else fixed (fp32 state); `chain`: sends that run one
    after another on the critical path (the serial recurrence's c-1), 0 when all run at once."""

    op: str
    method: Method
    collective: Literal["all_gather", "send_recv", "all_reduce"]
    values: tuple[str, ...]
    per_token: float = 0.0
    per_seq: float = 0.0
    elem_bytes: float | None = None
    chain: int = 0
    group: Literal["cp", "attn_tp"] = "cp"  # the CP group, or (`--cp-layers mla`) the A attention-TP ranks

    def label(self) -> str:
        what = "+".join(self.values)
        kind = {"all_gather": "AG", "send_recv": "SR", "all_reduce": "AR"}[self.collective]
        width = f"{self.per_token:g}/tok" if self.per_token else f"{self.per_seq:g}/seq"
        return f"CP-{kind}({what} {width})"

    def to_json(self) -> dict[str, object]:
        return {
            "op": self.op,
            "method": self.method,
            "collective": self.collective,
            "values": list(self.values),
            "elements_per_token": self.per_token,
            "elements_per_seq": self.per_seq,
            "elem_bytes": self.elem_bytes,
            "serial_steps": self.chain,
            "group": self.group,
        }


@dataclass(frozen=True)
class CpKind:
    """One layer kind under CP: how its tokens are split and what its mixers exchange."""

    kind: str
    split: Split
    exchanges: tuple[CpExchange, ...] = ()
    reasons: tuple[str, ...] = ()  # why CP cannot run this kind (empty: legal)
    replaces: tuple[str, ...] = ()  # values whose plan collectives the CP exchanges replace (`mla` mode)
    replicated: tuple[tuple[str, int], ...] = ()  # (op, n): each rank runs n times the op's TP share (`mla`)
    attention_ops: tuple[str, ...] = ()  # `mla`: ops whose weights a rank holds at attention TP tp/cp

    @property
    def legal(self) -> bool:
        return not self.reasons

    def units_per_token(self) -> float:
        """Relative units per token (AG: W, as the TP table counts them); per-sequence exchanges are
        not per token and are left out."""
        return sum(x.per_token for x in self.exchanges if x.collective == "all_gather")


@dataclass(frozen=True)
class CpAudit:
    """CP over a mesh (its CP size `cp` over TP `tp` groups, its CP options) for a whole model."""

    mesh: Mesh
    kinds: dict[str, CpKind] = field(default_factory=dict)
    model_reasons: tuple[str, ...] = ()  # why the mode cannot run this model at all

    @property
    def cp(self) -> int:
        return self.mesh.cp

    @property
    def tp(self) -> int:
        return self.mesh.tp

    @property
    def recurrence(self) -> str:
        """How linear attention hands its state on: "scan" or "serial" (`Mesh.cp_recurrence`)."""
        return self.mesh.cp_recurrence

    @property
    def layers(self) -> str:
        """Which layers are token-sharded: "all" or "mla" (`Mesh.cp_layers`)."""
        return self.mesh.cp_layers

    @property
    def legal(self) -> bool:
        return not self.model_reasons and all(k.legal for k in self.kinds.values())

    @property
    def reasons(self) -> list[str]:
        return [*self.model_reasons, *(f"[{k.kind}] {r}" for k in self.kinds.values() for r in k.reasons)]

    @property
    def token_cp(self) -> int:
        """How many ways every layer's tokens are split: `cp` under `all`, 1 under `mla` (only the MLA
        attention sees a shard; the rest runs the full sequence)."""
        return self.cp if self.layers == "all" else 1

    @property
    def attn_tp(self) -> int:
        """The MLA attention's TP width under `mla` (tp / cp); `tp` under `all`."""
        return self.tp // self.cp if self.layers == "mla" and self.cp <= self.tp else self.tp

    def to_json(self) -> dict[str, object]:
        return {
            "cp": self.cp,
            "layers": self.layers,
            "attention_tp": self.attn_tp,
            "recurrence": self.recurrence,
            "legal": self.legal,
            "reasons": self.reasons,
            "kinds": {
                k: {
                    "split": v.split,
                    "legal": v.legal,
                    "units_per_token": v.units_per_token(),
                    "exchanges": [x.to_json() for x in v.exchanges],
                    "replaces_plan_collectives_on": list(v.replaces),
                    "replicated_ops": {op: n for op, n in v.replicated},
                    "attention_tp_weights": list(v.attention_ops),
                }
                for k, v in self.kinds.items()
            },
        }


def _per_rank_heads(heads: int, mesh: Mesh) -> float:
    """Heads one TP rank holds (fewer heads than ranks: one each, replicated, as the engines do)."""
    return max(1.0, heads / mesh.tp)


def _producer(lg: LayerGraph, value: str) -> Op | None:
    return next((o for o in lg.ops if o.output == value), None)


def _mixer_exchanges(lg: LayerGraph, op: Op, mesh: Mesh) -> list[CpExchange] | str:
    """The CP exchanges of one token mixer on `mesh` (by its mixer's CP method, `Mixer.cp`), or the reason
    it has none."""
    m, tp = mixer_of(op), mesh.tp
    method = m.cp if m is not None else None
    if method == "kv_all_gather":
        k, v = op.inputs[1], op.inputs[2]
        kv_heads = op.int_attr("kv_heads", op.int_attr("heads", 1))
        share = _per_rank_heads(kv_heads, mesh) / kv_heads
        width = (lg.values[k].width + lg.values[v].width) * share
        return [CpExchange(op.name, "kv_all_gather", "all_gather", (k, v), per_token=width)]
    if method == "latent_all_gather":
        kv_b = _producer(lg, op.inputs[1])
        if kv_b is None or not kv_b.inputs:
            return "its K/V has no producer in the graph, so the latent to gather is unknown"
        latent, rope = kv_b.inputs[0], op.inputs[2]
        width = lg.values[latent].width + lg.values[rope].width  # shared by every head: not split by TP
        return [CpExchange(op.name, "latent_all_gather", "all_gather", (latent, rope), per_token=width)]
    if m is not None and method == "state" and m.state_dims is not None:
        return _state_exchanges(op, m.state_dims(op), m.inner_conv_channels(op), mesh)
    if method == "conv_halo":
        kernel = op.int_attr("kernel", 1)
        if kernel <= 1:
            return []
        width = lg.values[op.inputs[0]].width / tp
        return [CpExchange(op.name, "conv_halo", "send_recv", (op.inputs[0],), per_seq=(kernel - 1) * width)]
    return (f"{op.name} ({op.attrs.get('impl')}) has no context-parallel method: tpplan knows K/V or latent "
            "all-gather for softmax attention and the state hand-off for KDA/GDN; run it without --cp")  # fmt: skip


def _state_exchanges(op: Op, dims: tuple[int, int, int], conv_channels: int, mesh: Mesh) -> list[CpExchange]:
    """A recurrence's state hand-off (serial chain or scan) and, where the mixer runs a short conv inside
    the op (`conv_channels`), that conv's halo."""
    (heads, dk, dv), tp, recurrence = dims, mesh.tp, mesh.cp_recurrence
    h = heads / tp
    out: list[CpExchange] = []
    if recurrence == "serial":
        out.append(CpExchange(op.name, "state_serial", "send_recv", ("state",), per_seq=h * dk * dv,
                              elem_bytes=STATE_ELEM_BYTES, chain=mesh.cp - 1))  # fmt: skip
    else:  # every rank's final state and its chunk's transition (dk x dk per head), all-gathered
        out.append(CpExchange(op.name, "state_scan", "all_gather", ("state", "transition"),
                              per_seq=h * (dk * dv + dk * dk), elem_bytes=STATE_ELEM_BYTES))  # fmt: skip
    kernel = op.int_attr("kernel", 1)
    if conv_channels and kernel > 1:  # GDN's conv runs inside the mixer op on q, k, v
        halo = CpExchange(
            op.name, "conv_halo", "send_recv", ("conv_tail",), per_seq=(kernel - 1) * (conv_channels / tp)
        )
        # serial: the tail rides after the state; scan: the conv needs the halo before the local pass
        out.insert(len(out) if recurrence == "serial" else 0, halo)
    return out


def _split_of(exchanges: list[CpExchange]) -> Split:
    methods = {x.method for x in exchanges}
    if methods & {"kv_all_gather", "latent_all_gather"}:
        return "zigzag"
    if methods:
        return "contiguous"
    return "none"


def attention_output(lg: LayerGraph) -> str | None:
    """The value the attention half of a layer hands to the residual add in the middle (o_proj's output)."""
    add = next((o for o in lg.middle if op_kind(o.kind).sums_inputs), None)
    if add is None:
        return None
    return next(
        (v for v in add.inputs if (p := _producer(lg, v)) is not None and not op_kind(p.kind).sums_inputs), None
    )


def _audit_mla_only(graph: ModelGraph, mesh: Mesh) -> CpAudit:
    """`--cp-layers mla`: the MLA layers' attention token-sharded inside the TP group (SGLang PR #38344)."""
    tp, cp = mesh.tp, mesh.cp
    model_reasons: list[str] = []
    if tp % cp:
        model_reasons.append(f"--cp-layers mla puts the CP group inside the TP group: CP {cp} must divide TP {tp}")
    attn_tp = max(1, tp // cp)
    kinds: dict[str, CpKind] = {}
    for kind, lg in graph.kinds.items():
        mla = next((o for o in lg.ops if (m := mixer_of(o)) is not None and m.cp_layers_mla), None)
        if mla is None or cp == 1:
            kinds[kind] = CpKind(kind, "none")
            continue
        out, kv_b = attention_output(lg), _producer(lg, mla.inputs[1])
        if out is None or kv_b is None:
            kinds[kind] = CpKind(kind, "zigzag", reasons=("its attention output or K/V expansion is not in the graph",))
            continue
        proj = _producer(lg, out)
        name = proj.name if proj is not None else out
        width = float(lg.values[out].width)
        xs = []
        if attn_tp > 1:  # o_proj's partial sums over the A attention-TP ranks, on this rank's rows
            xs.append(CpExchange(name, "attn_tp_all_reduce", "all_reduce", (out,), per_token=width, group="attn_tp"))
        xs.append(CpExchange(name, "output_all_gather", "all_gather", (out,), per_token=width))
        add = lg.middle_add
        half = lg.ops[: lg.ops.index(add)]  # the attention half: every rank holds its heads at attention TP
        held = tuple(o.name for o in half if o.weight_numel)
        kinds[kind] = CpKind(kind, "zigzag", tuple(xs), replaces=(out,), replicated=((kv_b.name, cp),),
                             attention_ops=held)  # fmt: skip
    if cp > 1 and all(k.split == "none" for k in kinds.values()):
        model_reasons.append("--cp-layers mla shards only MLA layers and this model has none: use --cp-layers all")
    return CpAudit(mesh, kinds, tuple(model_reasons))


def audit_cp(graph: ModelGraph, mesh: Mesh) -> CpAudit:
    """Per layer kind: its token split and CP exchanges at `mesh`'s CP over its TP groups, from the graph.

    A layer kind with both softmax and linear attention cannot take both splits; none of the
    families has one (a hybrid's kinds are either), so such a kind is refused with its reason.
    `mesh.cp_layers="mla"`: only the MLA layers, the CP group inside the TP group (`_audit_mla_only`)."""
    cp, layers = mesh.cp, mesh.cp_layers
    if cp < 1:
        raise TpplanError(f"cp={cp}", "the CP size must be at least 1", "pass cp=1 or more")
    if layers not in CP_LAYERS:
        raise TpplanError(f"cp_layers={layers}", "unknown CP layer set", f"choose one of {', '.join(CP_LAYERS)}")
    if layers == "mla":
        return _audit_mla_only(graph, mesh)
    kinds: dict[str, CpKind] = {}
    for kind, lg in graph.kinds.items():
        xs: list[CpExchange] = []
        reasons: list[str] = []
        if cp > 1:
            for op in lg.ops:
                if not op_kind(op.kind).mixes_tokens:
                    continue
                got = _mixer_exchanges(lg, op, mesh)
                if isinstance(got, str):
                    reasons.append(got)
                else:
                    xs.extend(got)
        split = _split_of(xs)
        methods = {x.method for x in xs}
        if methods & {"kv_all_gather", "latent_all_gather"} and methods & {"state_scan", "state_serial"}:
            reasons.append("softmax and linear attention in one layer need a zigzag and a contiguous split at once")
        kinds[kind] = CpKind(kind, split, tuple(xs), tuple(reasons))
    return CpAudit(mesh, kinds)


def zigzag_chunks(ranks: int, rank: int) -> tuple[int, int]:
    """The two of 2*ranks chunks rank `rank` of a zigzag split over `ranks` holds: i and 2*ranks-1-i
    (causal work balanced)."""
    return rank, 2 * ranks - 1 - rank


def chunk_bounds(tokens: int, pieces: int) -> list[tuple[int, int]]:
    """[start, stop) of `pieces` near-equal contiguous pieces of `tokens` (the first ones longer)."""
    base, extra = divmod(tokens, pieces)
    out, start = [], 0
    for i in range(pieces):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def rank_positions(tokens: int, ranks: int, rank: int, split: Split) -> list[int]:
    """The absolute positions rank `rank` of the `ranks` a sequence's tokens are split over (the CP group's)
    holds of a `tokens`-long sequence under `split`."""
    if ranks == 1 or split == "none":
        return list(range(tokens))
    if split == "zigzag":
        bounds = chunk_bounds(tokens, 2 * ranks)
        return [p for i in zigzag_chunks(ranks, rank) for p in range(*bounds[i])]
    start, stop = chunk_bounds(tokens, ranks)[rank]
    return list(range(start, stop))


def model_split(audit: CpAudit) -> Split:
    """One token split for the whole model: the residual stream of a rank must hold the same tokens
    in every layer, so a model mixing softmax (zigzag) and linear (contiguous) attention kinds uses
    the contiguous split (attention then loses the causal balance: `causal_imbalance`)."""
    splits = {k.split for k in audit.kinds.values()} - {"none"}
    if not splits:
        return "none"
    return "contiguous" if "contiguous" in splits else "zigzag"


def causal_imbalance(ranks: int, split: Split) -> float:
    """The slowest rank's causal pairs over the mean when a sequence's tokens are split over `ranks` (1 under
    zigzag: balanced; the last of c contiguous chunks holds (2c-1)/c of the mean's pairs)."""
    if ranks == 1 or split != "contiguous":
        return 1.0
    return (2 * ranks - 1) / ranks


__all__ = [
    "CP_LAYERS",
    "CP_SIZES",
    "MAX_CP",
    "SGLANG_CP_UTILS",
    "CpAudit",
    "CpExchange",
    "CpKind",
    "CpLayers",
    "Recurrence",
    "attention_output",
    "audit_cp",
    "causal_imbalance",
    "chunk_bounds",
    "model_split",
    "rank_positions",
    "zigzag_chunks",
]
