"""The vocabulary of tpplan's dataflow graphs: op kinds, weight splits, values, ops, blocks, layer
graphs and the `Builder` that families and MLP builders write them with.

Below `graph.py` (which assembles one graph per layer structure from the registered mixers and MLP
builders), so the builders can import these without importing the assembly that calls them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import SupportsFloat, SupportsInt

from tpplan.models.spec import LayerSpec


class OpKind(StrEnum):
    """What an op does, as far as placement rules care."""

    LINEAR = "linear"  # y = x W^T, token-local; weight [out, in]
    NORM = "norm"  # RMSNorm over the whole feature row of a token
    HEAD_NORM = "head_norm"  # RMSNorm within each head (optionally gated by a second input)
    SLICE = "slice"  # a contiguous feature range of its input
    UNARY = "unary"  # elementwise non-linear map (sigmoid, activation)
    MUL = "mul"  # elementwise product of two values
    SWIGLU = "swiglu"  # silu(gate) * up
    ADD = "add"  # elementwise sum (residual adds, expert sums)
    TOKEN_MIX = "token_mix"  # attention / recurrence / short conv: mixes tokens within a head
    ROUTER = "router"  # MoE gating: scores from the whole row, top-k per token
    EXPERTS = "experts"  # routed experts (grouped GEMMs)
    ATTN_RES = "attn_res"  # K3 block attention residual: softmax over snapshot rows per token
    MEAN_SQ = "mean_sq"  # per-token mean of squares over each input's whole row (a feature reduction)
    RMS_SCALE = "rms_scale"  # x * rsqrt(mean_sq + eps) * w: an RMSNorm whose statistic is an input


class WeightSplit(StrEnum):
    """How a weight is placed on the TP group."""

    COL = "col"  # split by output heads/features: each rank owns out/N rows of W
    ROW = "row"  # split by input features: each rank owns in/N columns of W
    REPLICATED = "replicated"  # every rank holds all of W (memory price: full size per rank)
    EXPERT = "expert"  # routed experts: split over ranks by the MoE mode (TP, EP or all-to-all)
    NONE = "none"  # no weight (or a tiny per-feature vector that follows its activation)


@dataclass(frozen=True)
class Value:
    name: str
    width: int  # features per token
    heads: int = 0  # head groups the width is made of (0: not head-structured)


@dataclass(frozen=True)
class Op:
    """One op of a layer. `role` is the plan-facing name, e.g. `mla.g_proj`."""

    name: str
    kind: OpKind
    inputs: tuple[str, ...]
    output: str
    role: str
    weight: str = ""  # HF parameter name under the layer, e.g. `self_attn.g_proj.weight`
    weight_shape: tuple[int, ...] = ()
    split: WeightSplit = WeightSplit.NONE  # the Megatron default placement of `weight`
    split_heads: int = 0  # the head count that must divide by N for a COL/ROW split
    flops_per_token: float = 0.0  # forward FLOPs per token, context-independent part
    ctx_flops_per_token: float = 0.0  # per token per token of context (attention scores)
    note: str = ""  # what the op is, in words, for explanations
    attrs: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def reduces_into_stream(self) -> bool:
        """A partial sum reaching this op is its block's output being reduced into the residual stream:
        the residual add, or a sandwich norm on the block output (Gemma). It reduces to the plan's
        stream placement (all-reduce for R, reduce-scatter for S(tok)), not to the `reduce` target."""
        return self.role.startswith("layer.") and (self.kind is OpKind.ADD or bool(self.attrs.get("block_output")))

    def int_attr(self, key: str, default: int | None = None) -> int:
        """`attrs[key]` as an int. Attrs hold the builders' mixed facts (counts, names, flags, layouts),
        so each reader names the kind it expects and a wrong one fails here, not in arithmetic."""
        value = self.attrs.get(key, default)
        if not isinstance(value, SupportsInt):
            raise TypeError(f"op {self.name}: attrs[{key!r}] is {value!r}, not a number")
        return int(value)

    def float_attr(self, key: str, default: float | None = None) -> float:
        """`attrs[key]` as a float (see `int_attr`)."""
        value = self.attrs.get(key, default)
        if not isinstance(value, SupportsFloat):
            raise TypeError(f"op {self.name}: attrs[{key!r}] is {value!r}, not a number")
        return float(value)

    def optional_int_attr(self, key: str) -> int | None:
        """`attrs[key]` as an int, or None where the op has none (a window, a chunk: unset means off)."""
        return None if self.attrs.get(key) is None else self.int_attr(key)

    def parts(self) -> Mapping[str, int]:
        """A fused projection's parts: HF weight name -> its rows, in order (empty: not fused)."""
        value = self.attrs.get("parts") or {}
        if not isinstance(value, Mapping):
            raise TypeError(f"op {self.name}: attrs['parts'] is {value!r}, not a name -> rows mapping")
        return value

    def head_blocks(self) -> Sequence[Sequence[int]]:
        """Per part, the row blocks of one head group ([q, k, v] dims: Qwen3-Next's in_proj_qkvz)."""
        value = self.attrs.get("head_blocks", ())
        if not isinstance(value, Sequence):
            raise TypeError(f"op {self.name}: attrs['head_blocks'] is {value!r}, not a list of blocks")
        return value

    @property
    def weight_numel(self) -> int:
        n = 1
        for d in self.weight_shape:
            n *= d
        return n if self.weight_shape else 0


@dataclass(frozen=True)
class Block:
    """The ops of one sub-block: `attn` (token mixer) or `mlp`."""

    name: str  # "attn" | "mlp"
    kind: str  # "mla" | "kda" | "gqa" | "gdn" | "dense" | "moe"
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class LayerGraph:
    kind: str  # e.g. "mla+moe"
    spec: LayerSpec
    hidden: int
    values: dict[str, Value]
    entry: tuple[Op, ...]  # residual add + norm (or AttnRes) feeding attention
    attn: Block
    middle: tuple[Op, ...]  # residual add + norm feeding the MLP
    mlp: Block
    attn_res: bool = False

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.entry + self.attn.ops + self.middle + self.mlp.ops

    def region_of(self, op: Op) -> str:
        """`attn_side` (the seed's attention-input boundary and the attention block) or `mlp_side`."""
        if op in self.entry or op in self.attn.ops:
            return "attn_side"
        return "mlp_side"

    def consumers(self, value: str) -> list[Op]:
        return [op for op in self.ops if value in op.inputs]

    @property
    def middle_add(self) -> Op:
        """The residual add between the attention block and the MLP: its output is the stream the MLP's
        output is added to (the runtime's `resid` after each layer)."""
        return next(op for op in self.middle if op.kind is OpKind.ADD)


# ----------------------------------------------------------------------------------------------
# Builders


class Builder:
    """Accumulates values and ops with short helpers, so each family reads like its forward."""

    def __init__(self, prefix: str, hidden: int) -> None:
        self.prefix = prefix  # role namespace, e.g. "mla"
        self.hidden = hidden
        self.values: dict[str, Value] = {}
        self.ops: list[Op] = []

    def value(self, name: str, width: int, heads: int = 0) -> str:
        self.values[name] = Value(name, width, heads)
        return name

    def op(
        self,
        name: str,
        kind: OpKind,
        inputs: tuple[str, ...],
        out: str,
        out_width: int,
        out_heads: int = 0,
        **kw: object,
    ) -> str:
        if out in self.values:  # values are looked up by name: a second producer would shadow the first
            raise ValueError(f"op {name}: value {out!r} is already produced in this layer; give it another name")
        self.value(out, out_width, out_heads)
        role = kw.pop("role", f"{self.prefix}.{name}")
        # `kw` are Op's own fields, named by the helpers above; mypy cannot check them through **kw.
        self.ops.append(Op(name=name, kind=kind, inputs=inputs, output=out, role=role, **kw))  # type: ignore[arg-type]
        return out

    def linear(
        self,
        name: str,
        x: str,
        out: str,
        out_features: int,
        split: WeightSplit,
        heads: int = 0,
        weight: str = "",
        note: str = "",
    ) -> str:
        in_features = self.values[x].width
        return self.op(
            name,
            OpKind.LINEAR,
            (x,),
            out,
            out_features,
            heads if split is WeightSplit.COL else 0,
            weight=weight,
            weight_shape=(out_features, in_features),
            split=split,
            split_heads=heads,
            flops_per_token=2.0 * in_features * out_features,
            note=note,
        )

    def out_proj(self, x: str, heads: int, name: str = "o_proj", weight: str = "self_attn.o_proj.weight") -> str:
        """The attention block's output projection back to the hidden (`attn_out`), row-parallel over
        its input heads: every token mixer ends with it."""
        return self.linear(
            name, x, "attn_out", self.hidden, WeightSplit.ROW, heads=heads, weight=weight,
            note="output projection, split by input heads",
        )  # fmt: skip

    def norm(self, name: str, x: str, out: str, weight: str, note: str = "RMSNorm") -> str:
        w = self.values[x].width
        return self.op(
            name, OpKind.NORM, (x,), out, w, weight=weight, weight_shape=(w,), flops_per_token=4.0 * w, note=note
        )
