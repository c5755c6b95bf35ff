"""Op-level dataflow graphs of one decoder layer, built from a `LayerSpec`.

A layer graph is a list of ops in execution order. Every op names its input and output values;
every value has a per-token width and, where it is made of heads, a head count (the unit a
feature shard may cut at). Ops carry the facts placement rules need (does it mix tokens? does
it need whole rows? which weight does it own and how is that weight split by default?) and the
facts the cost model needs (weight size, FLOPs per token). The same graph drives the audit, the
cost model and the runtime, so names follow HF checkpoint names where one exists.

Each layer graph reads two values from outside:
- `resid`: the residual stream (true values, K3: the running block prefix), and
- `delta`: the previous block's output, usually a partial sum still to be reduced.
It produces `resid_out` (the stream after the attention add) and `mlp_out` (this layer's MLP
output, the next layer's `delta`). K3's attention residual reads the snapshot bank `bank` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpplan.models.blocks import mlp_builder
from tpplan.models.opkinds import mixer, op_kind
from tpplan.models.ops import Block, Builder, LayerGraph, Op, OpKind, Value, WeightSplit
from tpplan.models.spec import LayerSpec, ModelSpec

# The graph vocabulary lives in `ops.py`; named here too, where most callers look for it.
__all__ = [
    "Block",
    "Builder",
    "LayerGraph",
    "ModelGraph",
    "Op",
    "OpKind",
    "Value",
    "WeightSplit",
    "build_layer",
    "build_model_graph",
]


def _entry_ops(b: Builder, prefix: str, attn_res: bool, norm_weight: str, post: bool) -> None:
    """Residual add and pre-norm (or K3's AttnRes aggregation) before a sub-block."""
    h = b.hidden
    src, delta = ("resid", "delta") if not post else ("resid_mid", "attn_out")
    stream = "resid_mid" if not post else "resid_out"
    side = "attn" if not post else "mlp"
    b.op(
        f"{prefix}residual_add",
        OpKind.ADD,
        (src, delta),
        stream,
        h,
        role=f"layer.{side}_add",
        flops_per_token=h,
        note="residual add (stream + block output)",
    )
    normed = "x" if not post else "y"
    if attn_res:
        b.op(
            f"{prefix}attn_res",
            OpKind.ATTN_RES,
            ("bank", stream),
            normed,
            h,
            role=f"layer.{side}_in",
            weight=f"{side}_res",
            weight_shape=(3, h),
            flops_per_token=0.0,
            note="block attention residual: per-token softmax over the snapshot bank and the "
            "running prefix, then RMSNorm (replaces the pre-norm)",
        )
    else:
        b.op(
            f"{prefix}norm",
            OpKind.NORM,
            (stream,),
            normed,
            h,
            role=f"layer.{side}_in",
            weight=norm_weight,
            weight_shape=(h,),
            flops_per_token=4.0 * h,
            note=norm_weight.removesuffix(".weight"),
        )
    b.ops[-1].attrs["norm_of"] = stream


def _post_norm(b: Builder, value: str, weight: str) -> None:
    """Sandwich norm (Gemma): the block's last op now writes `<value>_raw`, and an RMSNorm over the
    whole row turns it into `value`, so the residual add (and the next layer) read the normed output.
    The norm needs true rows, so a partial sum is reduced before it, not at the add."""
    j = next(k for k, op in enumerate(b.ops) if op.output == value)
    raw = f"{value}_raw"
    b.ops[j] = replace(b.ops[j], output=raw, attrs=b.ops[j].attrs)
    out = b.values.pop(value)  # renamed: the norm below is now `value`'s only producer
    b.values[raw] = Value(raw, out.width, out.heads)
    w = b.hidden
    b.op(
        weight.removesuffix(".weight"), OpKind.NORM, (raw,), value, w, role=f"layer.{value}_norm", weight=weight,
        weight_shape=(w,), flops_per_token=4.0 * w, attrs={"block_output": True},
        note=f"{weight.split('.')[0]} (sandwich norm on the block output)",
    )  # fmt: skip


def build_layer(spec: LayerSpec, hidden: int, kind: str, attn_res: bool = False) -> LayerGraph:
    """Build the dataflow of one decoder layer."""
    entry = Builder("layer", hidden)
    for v, w in (("resid", hidden), ("delta", hidden)):
        entry.value(v, w)
    if attn_res:
        entry.value("bank", hidden)
    _entry_ops(entry, "attn_", attn_res, "input_layernorm.weight", post=False)

    a = Builder(spec.attn.kind, hidden)
    a.values.update(entry.values)
    build_attn = mixer(spec.attn.kind).build
    assert build_attn is not None, spec.attn.kind
    build_attn(a, spec.attn, "x")
    if spec.sandwich:
        _post_norm(a, "attn_out", "post_attention_layernorm.weight")

    mid = Builder("layer", hidden)
    mid.values.update(a.values)
    pre_mlp = "pre_feedforward_layernorm.weight" if spec.sandwich else "post_attention_layernorm.weight"
    _entry_ops(mid, "mlp_", attn_res, pre_mlp, post=True)

    m = Builder(spec.mlp.kind, hidden)
    m.values.update(mid.values)
    mlp_builder(spec.mlp.kind)(m, spec.mlp, "y")
    if spec.sandwich:
        _post_norm(m, "mlp_out", "post_feedforward_layernorm.weight")
    return LayerGraph(
        kind=kind,
        spec=spec,
        hidden=hidden,
        values=m.values,
        entry=tuple(entry.ops),
        attn=Block("attn", spec.attn.kind, tuple(a.ops)),
        middle=tuple(mid.ops),
        mlp=Block("mlp", spec.mlp.kind, tuple(m.ops)),
        attn_res=attn_res,
    )


@dataclass(frozen=True)
class ModelGraph:
    spec: ModelSpec
    kinds: dict[str, LayerGraph]  # distinct layer structures
    layer_kinds: tuple[str, ...]  # kind of each layer, in order

    @property
    def hidden(self) -> int:
        return self.spec.hidden

    @property
    def has_routed_experts(self) -> bool:
        """Whether any layer routes tokens to experts: what `--expert-dtype` and the `ep<k>` plans act on."""
        return any(op_kind(op.kind).routed_experts for lg in self.kinds.values() for op in lg.ops)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(self.kinds, 0)
        for k in self.layer_kinds:
            out[k] += 1
        return out


def build_model_graph(spec: ModelSpec) -> ModelGraph:
    """One `LayerGraph` per distinct layer structure, and the kind of every layer."""
    attn_res = spec.attn_res_block_size is not None
    kinds = {key: build_layer(ls, spec.hidden, key, attn_res) for key, ls in spec.layer_kinds().items()}
    by_spec = {ls: key for key, ls in spec.layer_kinds().items()}
    return ModelGraph(spec, kinds, tuple(by_spec[ls] for ls in spec.layers))
