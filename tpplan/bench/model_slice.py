"""A representative slice of a model for the GPU benchmark: real widths, fewer layers and experts.

A whole Kimi-K3 does not fit on two GPUs, but its layers are a handful of repeated structures.
The benchmark runs a few consecutive layers at their real hidden, head and latent widths, with
as many routed experts and requests as the card holds (`slice_memory`), and scales the measurement
back to the whole model. Torch-free:
the predictions are made for exactly this slice (the same `ModelGraph`), so measured and
predicted always describe the same work.

Default layers: the first window of `SLICE_LAYERS` consecutive layers, all with the model's most
common MLP kind (MoE for K3), that contains every attention kind of the model. For K3
(KDA, KDA, KDA, MLA repeating, layer 0 dense) that is layers 1-4: three KDA layers and one MLA
layer, the model's 3:1 pattern.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from tpplan.errors import TpplanError
from tpplan.models.config import load_model
from tpplan.models.graph import ModelGraph, build_model_graph
from tpplan.models.spec import LayerSpec, ModelSpec, MoESpec

SLICE_LAYERS = 4


@dataclass(frozen=True)
class SliceSpec:
    """What to cut out of a model: layer indices (0-based) and routed experts kept (None: all)."""

    model: str
    layers: tuple[int, ...]
    experts: int | None


@dataclass(frozen=True)
class ModelSlice:
    """The slice's graph, the full model's graph, and a sentence saying what was kept."""

    spec: SliceSpec
    graph: ModelGraph
    full: ModelGraph
    experts: int | None  # routed experts per MoE layer in the slice (None: no MoE)
    top_k: int | None

    @property
    def full_moe_experts(self) -> int:
        """Routed experts per MoE layer of the whole model (0: no MoE)."""
        return max((ly.mlp.experts for ly in self.full.spec.layers if isinstance(ly.mlp, MoESpec)), default=0)

    @property
    def description(self) -> str:
        g, full = self.graph, self.full
        counts = Counter(attn_kind(layer) for layer in g.spec.layers)
        parts = " + ".join(f"{n} {k.upper()}" for k, n in counts.items())
        text = f"{parts} layer{'s' if g.spec.num_layers > 1 else ''} (of {full.spec.num_layers}) at hidden {g.hidden}"
        moe = next((layer.mlp for layer in g.spec.layers if isinstance(layer.mlp, MoESpec)), None)
        full_moe = next((layer.mlp for layer in full.spec.layers if isinstance(layer.mlp, MoESpec)), None)
        if moe is not None and full_moe is not None:
            latent = f"latent MoE {moe.latent}, " if moe.latent else ""
            text += (
                f", {latent}expert intermediate {moe.expert_intermediate}, {moe.experts} of {full_moe.experts} "
                f"experts, top-{moe.top_k}" + (f" (of {full_moe.top_k})" if moe.top_k != full_moe.top_k else "")
            )
        return text + f"; layers {','.join(map(str, self.spec.layers))} of {full.spec.name}"


def attn_kind(layer: LayerSpec) -> str:
    """'mla', 'kda', 'gqa' or 'gdn'."""
    return str(layer.attn.kind)


def default_layers(spec: ModelSpec, size: int = SLICE_LAYERS) -> tuple[int, ...]:
    """The first window of `size` consecutive layers with the commonest MLP kind covering every attention kind."""
    n = spec.num_layers
    size = min(size, n)
    mlp = Counter(layer.mlp.kind for layer in spec.layers).most_common(1)[0][0]
    kinds = {attn_kind(layer) for layer in spec.layers}
    for start in range(n - size + 1):
        window = spec.layers[start : start + size]
        if all(layer.mlp.kind == mlp for layer in window) and {attn_kind(layer) for layer in window} == kinds:
            return tuple(range(start, start + size))
    return tuple(range(size))


def parse_layers(text: str | None, spec: ModelSpec) -> tuple[int, ...]:
    """`None`/'auto' -> default; 'A:B' -> range(A, B); '1,2,3,4' -> those (0-based layer indices)."""
    n = spec.num_layers
    where = f"--layers {text}"
    fix = f"give 'auto', START:STOP or a comma list of 0-based layer indices below {n}"
    if text is None or text.strip() in ("", "auto"):
        return default_layers(spec)
    try:
        if ":" in text:
            start, _, stop = text.partition(":")
            lo, hi = int(start or 0), int(stop) if stop else n
            if lo < 0 or hi > n:  # before the range is built: 0:10**12 would fill memory
                raise TpplanError(where, f"layer {lo if not 0 <= lo < n else hi - 1} is outside 0..{n - 1}", fix)
            out = tuple(range(lo, hi))
        else:
            out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TpplanError(where, "not a layer range or list", fix) from None
    if not out:
        raise TpplanError(where, "selects no layers", fix)
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise TpplanError(where, f"layer {bad[0]} is outside 0..{n - 1}", fix)
    if len(set(out)) != len(out):
        raise TpplanError(where, "lists a layer twice", fix)
    return out


def _cut_moe(moe: MoESpec, experts: int) -> MoESpec:
    """Keep `experts` routed experts; top_k capped to them; groups dropped when they no longer divide."""
    top_k = min(moe.top_k, experts)
    n_group, topk_group = moe.n_group, moe.topk_group
    if n_group > 1 and (experts % n_group or experts // n_group < 2 or top_k > topk_group * (experts // n_group)):
        n_group = topk_group = 1
    return dataclasses.replace(moe, experts=experts, top_k=top_k, n_group=n_group, topk_group=topk_group)


def build_slice(
    model: str, layers: str | None = None, experts: int | None = None, spec: ModelSpec | None = None
) -> ModelSlice:  # fmt: skip
    """Cut `layers` (see `parse_layers`) out of `model`, keeping `experts` routed experts per MoE layer.
    `spec`: the model already built (a recorded run's config, `bench.repredict`); else `model` is loaded."""
    full_spec = spec if spec is not None else load_model(model)
    sel = parse_layers(layers, full_spec)
    picked = [full_spec.layers[i] for i in sel]
    moe_specs = [layer.mlp for layer in picked if isinstance(layer.mlp, MoESpec)]
    kept: int | None = None
    top_k: int | None = None
    if experts is not None and not moe_specs:
        raise TpplanError(f"experts={experts}", "the layers run hold no routed experts", "drop experts=")
    if moe_specs:
        most = max(m.experts for m in moe_specs)
        kept = most if experts is None else experts
        if kept < 1 or kept > most:
            raise TpplanError(f"experts={experts}", f"must be between 1 and the model's {most}", "pick fewer")
        new = []
        for layer in picked:
            if isinstance(layer.mlp, MoESpec):
                layer = dataclasses.replace(layer, mlp=_cut_moe(layer.mlp, min(kept, layer.mlp.experts)))
            new.append(layer)
        picked = new
        top_k = max(layer.mlp.top_k for layer in picked if isinstance(layer.mlp, MoESpec))
    # The bench runs every weight in its own dtype (bf16 random weights; the runtime has no fp8 or
    # mxfp4 kernels), so the slice it prices drops the checkpoint's quantization_config: priced at
    # fp8, DeepSeek-V3's GEMMs came out 40-55% faster than the bf16 GEMMs the run timed.
    spec = dataclasses.replace(full_spec, layers=tuple(picked), quant=None)
    return ModelSlice(SliceSpec(model, sel, kept), build_model_graph(spec), build_model_graph(full_spec), kept, top_k)


__all__ = [
    "SLICE_LAYERS",
    "ModelSlice",
    "SliceSpec",
    "build_slice",
    "default_layers",
    "parse_layers",
]
