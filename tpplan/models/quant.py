"""Weight formats read from a config's `quantization_config`: bytes per weight and GEMM dtype.

A checkpoint's `quantization_config` says which Linear modules hold quantized weights and in what
format; the rest (norms, routers, embedding, LM head and every module the config leaves out with
`modules_to_not_convert` / `ignore` / `exclude_modules`) stay in the activation dtype. Formats:

| format      | config                                        | values | scales                        | GEMM |
|-------------|-----------------------------------------------|--------|-------------------------------|------|
| fp8-block   | quant_method fp8 + weight_block_size [r, c]   | 8 bit  | fp32 per r x c block          | fp8  |
| fp8         | quant_method fp8 without blocks (per tensor)  | 8 bit  | fp32 per tensor               | fp8  |
| mxfp4       | quant_method mxfp4 (gpt-oss)                  | 4 bit  | e8m0 byte per 32 inputs       | bf16 |
| int4/int8   | compressed-tensors, weights type int (w4a16)  | 4/8 bit| bf16 per group (+ zero point) | bf16 |
| nvfp4       | compressed-tensors float 4 bit / modelopt NVFP4 | 4 bit | fp8 byte per 16 inputs + fp32 | bf16 |

Weight-only formats (int4, mxfp4, nvfp4 on Hopper) run dequantized: bf16 compute, weight bytes
read at the packed size; FP8 runs at the FP8 rate, as SGLang/vLLM run block-FP8 checkpoints
(w8a8, dynamic activation scales). Only Linear modules (LINEAR ops and routed experts) are ever
quantized here; routers (DeepSeek's gate is a bare parameter, kept bf16), norms and the
embedding/LM head are not. Module-name patterns are matched at the first layer of each layer kind.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpplan.errors import TpplanError


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix [rows = outputs, cols = inputs] is stored."""

    name: str
    bits: float  # bits per stored value
    compute: str  # "fp8": GEMM at the FP8 rate; "bf16": dequantized (weight-only format)
    block: tuple[int, int] | None = None  # 2-D scale blocks (rows, cols)
    group: int = 0  # 1-D scale groups along the input dim
    scale_bytes: float = 0.0  # bytes per block/group scale (zero point included)
    tensor_bytes: float = 0.0  # per-tensor scales

    def matrix_bytes(self, rows: int, cols: int) -> float:
        """Exact bytes of one [rows, cols] matrix: packed values plus every scale."""
        values = rows * cols * self.bits / 8
        if self.block:
            scales = math.ceil(rows / self.block[0]) * math.ceil(cols / self.block[1]) * self.scale_bytes
        elif self.group:
            scales = rows * math.ceil(cols / self.group) * self.scale_bytes
        else:
            scales = 0.0
        return values + scales + self.tensor_bytes


@dataclass(frozen=True)
class Quantization:
    """A config's quantization: one format for the modules it converts, and the ones it leaves out."""

    method: str
    fmt: WeightFormat
    skip: tuple[str, ...] = ()  # module-name patterns left unquantized
    targets: tuple[str, ...] = ()  # compressed-tensors: module patterns converted ("Linear": all)

    def converts(self, module: str) -> bool:
        """Whether the Linear module `module` (full HF name, no `.weight`) holds quantized weights."""
        if any(_matches(p, module) for p in self.skip):
            return False
        named = [t for t in self.targets if t != "Linear"]
        return not named or "Linear" in self.targets or any(_matches(t, module) for t in named)


def _matches(pattern: str, module: str) -> bool:
    """HF spellings: `re:REGEX` (compressed-tensors), globs with `*` (gpt-oss), else a name component run."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    if "*" in pattern:
        return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")
    return f".{pattern}." in f".{module}." or module.endswith(pattern)


def _fp8(q: Mapping[str, Any], label: str) -> WeightFormat:
    block = q.get("weight_block_size")
    if block is None:
        return WeightFormat("fp8", 8, "fp8", tensor_bytes=4)
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and 0 < b <= 2**16 for b in block)):
        raise TpplanError(
            f"{label}: field 'quantization_config.weight_block_size'",
            f"expected two positive integers, got {block!r}",
            "use the checkpoint's value, e.g. [128, 128]",
        )
    scale = 1 if q.get("scale_fmt") == "ue8m0" else 4
    return WeightFormat(f"fp8-block{block[0]}", 8, "fp8", block=(block[0], block[1]), scale_bytes=scale)


def _small_int(value: object) -> int:
    """A bit width or group size: a non-negative integer of at most 2^16 (TypeError/ValueError else)."""
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r:.40}")
    if not 0 <= value <= 2**16:
        raise ValueError(f"{value} is out of range")
    return value


def _compressed(q: Mapping[str, Any], label: str) -> tuple[WeightFormat, tuple[str, ...]]:
    groups = q.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise TpplanError(
            f"{label}: field 'quantization_config.config_groups'",
            "a compressed-tensors config needs at least one config group",
            "copy quantization_config from the checkpoint's config.json",
        )
    try:
        first = next(iter(groups.values()))
        w = first.get("weights") or {}
        bits = _small_int(w.get("num_bits", 8))
        kind = str(w.get("type", "int"))
        group = _small_int(w.get("group_size") or 0)
        acts = first.get("input_activations") or None
        act_bits = _small_int(acts.get("num_bits", 16)) if acts else 16
        targets = tuple(str(t) for t in first.get("targets") or ("Linear",))
    except (AttributeError, TypeError, ValueError) as exc:
        raise TpplanError(
            f"{label}: field 'quantization_config.config_groups'",
            f"not a compressed-tensors config group ({exc})",
            "copy quantization_config from the checkpoint's config.json",
        ) from None
    if kind == "float" and bits == 4:
        return WeightFormat("nvfp4", 4, "bf16", group=group or 16, scale_bytes=1, tensor_bytes=4), targets
    if kind == "float" and bits == 8:
        compute = "fp8" if act_bits == 8 else "bf16"
        return WeightFormat("fp8", 8, compute, group=group, scale_bytes=4 if group else 0, tensor_bytes=4), targets
    zero = 0 if w.get("symmetric", True) else 2
    return WeightFormat(f"int{bits}", bits, "bf16", group=group, scale_bytes=2 + zero), targets


def _skipped(q: Mapping[str, Any], label: str) -> tuple[str, ...]:
    """The module names a quantization leaves unconverted: a list of strings under any of its spellings."""
    for key in ("modules_to_not_convert", "ignore", "exclude_modules"):
        got = q.get(key)
        if got is None:
            continue
        if not (isinstance(got, list) and all(isinstance(m, str) for m in got)):
            raise TpplanError(
                f"{label}: field 'quantization_config.{key}'",
                f"must be a list of module names (strings), got {got!r:.60}",
                "copy it from the checkpoint's config.json",
            )
        if got:
            return tuple(got)
    return ()


def parse_quantization(raw: Mapping[str, Any], label: str) -> Quantization | None:
    """The `quantization_config` of a config (top level, or a wrapper's text_config), or None."""
    q = raw.get("quantization_config")
    text = raw.get("text_config")
    if q is None and isinstance(text, dict):
        q = text.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise TpplanError(f"{label}: field 'quantization_config'", "expected an object", "copy it from the checkpoint")
    method = str(q.get("quant_method", "")).lower()
    skip = _skipped(q, label)
    if method == "fp8":
        return Quantization(method, _fp8(q, label), skip)
    if method == "mxfp4":
        return Quantization(method, WeightFormat("mxfp4", 4, "bf16", group=32, scale_bytes=1), skip)
    if method == "compressed-tensors":
        fmt, targets = _compressed(q, label)
        return Quantization(method, fmt, skip, targets)
    if method == "modelopt" and str(q.get("quant_algo", "")).upper() == "NVFP4":
        group = q.get("group_size") or 16
        if not (isinstance(group, int) and not isinstance(group, bool) and 1 <= group <= 2**16):
            raise TpplanError(f"{label}: field 'quantization_config.group_size'", f"must be a positive integer, got "
                              f"{group!r:.40}", "copy it from the checkpoint")  # fmt: skip
        fmt = WeightFormat("nvfp4", 4, "bf16", group=group, scale_bytes=1, tensor_bytes=4)
        return Quantization(method, fmt, skip)
    raise TpplanError(
        f"{label}: field 'quantization_config.quant_method'",
        f"quantization method {method or '(none)'!r} is not read by tpplan",
        "tpplan reads fp8 (block-wise), mxfp4, compressed-tensors (int4/int8/nvfp4) and modelopt NVFP4; "
        "remove quantization_config and pass expert_dtype= to price the weights instead",
    )


@dataclass(frozen=True)
class OpWeight:
    """A quantized op's stored weight: its format and the exact bytes of the whole (unsharded) weight."""

    fmt: WeightFormat
    full_bytes: float


def _linear_modules(op: Any) -> list[tuple[str, int, int, int]]:
    """(module name under the layer, rows, cols, how many alike) of the Linear modules an op's
    weight is made of; the routed experts are one entry per projection, counted once per expert."""
    kind = str(op.kind)
    if kind == "linear":
        parts = op.attrs.get("parts")
        if parts:
            return [(name.removesuffix(".weight"), rows, op.weight_shape[1], 1) for name, rows in parts.items()]
        out, inp = op.weight_shape
        return [(op.weight.removesuffix(".weight"), out, inp, 1)]
    if kind == "experts":
        e, _, width, inter = op.weight_shape
        return [
            (f"{op.weight}.0.{p}", r, c, e)
            for p, r, c in (("gate_proj", inter, width), ("up_proj", inter, width), ("down_proj", width, inter))
        ]
    return []


def op_weights(graph: Any) -> dict[tuple[str, str], OpWeight]:
    """(layer kind, op name) -> format and full bytes, for every op the model's quantization converts.

    Patterns are matched against `model.layers.{i}.<module>` with i the kind's first layer.
    """
    quant: Quantization | None = graph.spec.quant
    if quant is None:
        return {}
    first = {kind: graph.layer_kinds.index(kind) for kind in graph.kinds}
    out: dict[tuple[str, str], OpWeight] = {}
    for kind, lg in graph.kinds.items():
        for op in lg.ops:
            modules = _linear_modules(op)
            if not modules or not quant.converts(f"model.layers.{first[kind]}.{modules[0][0]}"):
                continue
            out[(kind, op.name)] = OpWeight(quant.fmt, sum(k * quant.fmt.matrix_bytes(r, c) for _, r, c, k in modules))
    return out
