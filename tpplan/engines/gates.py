"""The predicates engine gates name (`Gate.check`), decided from a deployment and the model.

Each returns (met, detail): met True/False, or None where it depends on something the memo cannot
see (then the gate is listed as "keep"); detail is a few words with the values it compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpplan.engines.sglang_sp_moe import K3_SP_TABLES
from tpplan.mesh import Mesh
from tpplan.models.spec import MLASpec, ModelSpec, MoESpec

DSA_MODEL_TYPES = frozenset({"deepseek_v32", "glm_moe_dsa"})  # DeepSeek sparse attention (DSA/NSA)


@dataclass(frozen=True)
class Launch:
    """What a launch line decides, as the gates read it: the model, its `mesh` (TP, PP; its CP is SGLang's
    attention CP the gates read), `dp` the engine's data-parallel size (vLLM's --data-parallel-size), the
    chunk, the GPU and the nodes."""

    spec: ModelSpec
    mesh: Mesh
    dp: int = 1
    chunk: int = 8192
    gpu: str = ""
    nodes: int = 1

    @property
    def tp(self) -> int:
        return self.mesh.tp

    @property
    def pp(self) -> int:
        return self.mesh.pp

    @property
    def cp(self) -> int:
        return self.mesh.cp


def gpu_sm(gpu: str) -> int | None:
    """CUDA compute capability (90, 100, 103, 120) from a GPU's marketing name, when known."""
    name = gpu.upper()
    if "H100" in name or "H200" in name or "H20" in name:
        return 90
    if "B300" in name:  # also GB300
        return 103
    if "B200" in name:  # also GB200
        return 100
    if "RTX PRO 6000" in name or "RTX 50" in name:
        return 120
    return None


def mla_of(spec: ModelSpec) -> MLASpec | None:
    """The model's MLA (also the one inside a DSA attention), if any."""
    for layer in spec.layers:
        attn = getattr(layer.attn, "mla", layer.attn)
        if isinstance(attn, MLASpec):
            return attn
    return None


def _moe(spec: ModelSpec) -> MoESpec | None:
    return next((layer.mlp for layer in spec.layers if isinstance(layer.mlp, MoESpec)), None)


Result = tuple[bool | None, str]


def _tp_gt_1(d: Launch) -> Result:
    return d.tp > 1, f"TP{d.tp}"


def _pp_is_1(d: Launch) -> Result:
    return d.pp == 1, f"pipeline-parallel size {d.pp}"


def _dp_gt_1(d: Launch) -> Result:
    return d.dp > 1, f"data-parallel size {d.dp}"


def _no_dp_attention(d: Launch) -> Result:
    return True, "tpplan's lines do not pass --enable-dp-attention"


def _no_prefill_cp(d: Launch) -> Result:
    return d.cp == 1, f"attention CP {d.cp}"


def _mla_q_lora(d: Launch) -> Result:
    mla = mla_of(d.spec)
    if mla is None:
        return False, "no q_lora_rank latent in this model"
    return mla.q_lora_rank is not None, f"q_lora_rank {mla.q_lora_rank}"


def _not_dsa(d: Launch) -> Result:
    return d.spec.model_type not in DSA_MODEL_TYPES, d.spec.model_type


def _input_scattered_pads(d: Launch) -> Result:
    padded = -(-d.chunk // d.tp) * d.tp
    extra = f" ({padded - d.chunk} dummy rows)" if padded != d.chunk else ""
    return True, f"a {d.chunk}-token chunk runs as {padded} rows at TP{d.tp}{extra}"


def _has_moe(d: Launch) -> Result:
    return _moe(d.spec) is not None, "routed experts" if _moe(d.spec) else "no routed experts"


def _experts_divide_tp(d: Launch) -> Result:
    moe = _moe(d.spec)
    if moe is None:  # nothing to place: SGLang builds no expert placement for a dense model class
        return True, "no routed experts to place"
    return moe.experts % d.tp == 0, f"{moe.experts} experts over {d.tp} ranks"


def _layernorm_sp_arch(d: Launch) -> Result:
    return d.spec.model_type == "qwen3", d.spec.model_type


def _k3_sp(sms: tuple[int, ...], tps: tuple[int, ...]) -> Callable[[Launch], Result]:
    def check(d: Launch) -> Result:
        if d.spec.model_type != "kimi_k3":
            return None, f"K3's collectives; {d.spec.model_type} runs NCCL's"
        sm = gpu_sm(d.gpu)
        where = f"{d.gpu or 'GPU unknown'}" + (f" (sm{sm})" if sm else "") + f", TP{d.tp}"
        if sm is None:
            return None, where
        return sm in sms and d.tp in tps, where

    return check


def k3_sp_table_device(gpu: str) -> str | None:
    """The device name a GPU's K3 SP tuning table is filed under (torch's device name), when tpplan can
    tell: GB300 and GB200 superchips by name; HGX B200/B300 report other names, which have no table."""
    name = gpu.upper()
    for device in ("GB300", "GB200"):
        if device in name:
            return f"NVIDIA {device}"
    return gpu or None


def _k3_sp_table(d: Launch) -> Result:
    if d.spec.model_type != "kimi_k3":
        return None, f"K3's collectives; {d.spec.model_type} runs NCCL's"
    if not d.gpu:
        return None, f"GPU unknown, TP{d.tp}"
    device = k3_sp_table_device(d.gpu)
    found = (device, d.tp) in K3_SP_TABLES
    return found, f"{d.gpu}, TP{d.tp}: " + ("a table ships" if found else "no table ships for it")


def _k3_sp_bucket(d: Launch) -> Result:
    if d.spec.model_type != "kimi_k3":
        return None, f"K3's collectives; {d.spec.model_type} runs NCCL's"
    key = (k3_sp_table_device(d.gpu), d.tp)
    if key not in K3_SP_TABLES:
        return None, f"no table for {d.gpu or 'GPU unknown'} at TP{d.tp}"
    nccl_from = K3_SP_TABLES[key]
    if nccl_from is None:
        return True, f"every bucket of the {d.gpu} TP{d.tp} table is fused"
    if d.chunk >= nccl_from:
        return False, f"a {d.chunk}-token chunk is at or above the {nccl_from}-token bucket, which picks NCCL"
    return True, f"a {d.chunk}-token chunk is below the {nccl_from}-token bucket that picks NCCL"


def _vllm_sp_moe_backend(d: Launch) -> Result:
    return True, "tpplan's lines pass deepep_high_throughput"


# The later index revision's table (the release has no pass); sm100 family collapsed, as the file does.
VLLM_SP_MIN_HIDDEN = {90: 8192, 100: 8192}
VLLM_SP_MIN_MIB_PER_GPU = {90: 8, 100: 32}


def _vllm_sp_threshold(d: Launch) -> Result:
    sm = gpu_sm(d.gpu)
    cap = 100 if sm == 103 else sm
    if cap is None:
        return None, f"GPU generation of {d.gpu or 'unknown'} not known"
    if cap not in VLLM_SP_MIN_HIDDEN:
        return False, f"no threshold for sm{cap}: SP off unless sp_min_token_num is set"
    if d.spec.hidden < VLLM_SP_MIN_HIDDEN[cap]:
        return False, f"hidden {d.spec.hidden} < {VLLM_SP_MIN_HIDDEN[cap]} on sm{cap}: SP off (a warning)"
    tokens = VLLM_SP_MIN_MIB_PER_GPU[cap] * 2**20 * d.tp // (d.spec.hidden * 2)
    word = "reaches" if d.chunk >= tokens else "does not reach"
    return d.chunk >= tokens, f"threshold {tokens:,} tokens at TP{d.tp}; the {d.chunk}-token chunk {word} it"


def _never(d: Launch) -> Result:
    return False, "not in this version"


CHECKS: dict[str, Callable[[Launch], Result]] = {
    "tp_gt_1": _tp_gt_1,
    "pp_is_1": _pp_is_1,
    "dp_gt_1": _dp_gt_1,
    "no_dp_attention": _no_dp_attention,
    "no_prefill_cp": _no_prefill_cp,
    "mla_q_lora": _mla_q_lora,
    "not_dsa": _not_dsa,
    "input_scattered_pads": _input_scattered_pads,
    "has_moe": _has_moe,
    "experts_divide_tp": _experts_divide_tp,
    "layernorm_sp_arch": _layernorm_sp_arch,
    "k3_sp_collective": _k3_sp((100, 103), (4, 8, 16)),
    "k3_sp_collective_sm103": _k3_sp((103,), (4, 8)),
    "k3_sp_collective_table": _k3_sp_table,
    "k3_sp_collective_bucket": _k3_sp_bucket,
    "vllm_sp_moe_backend": _vllm_sp_moe_backend,
    "vllm_sp_threshold": _vllm_sp_threshold,
    "never": _never,
}


def evaluate(check: str | None, d: Launch) -> Result:
    """Decide one gate's predicate (None: not decidable here)."""
    if check is None:
        return None, ""
    return CHECKS[check](d)


__all__ = ["CHECKS", "DSA_MODEL_TYPES", "Launch", "evaluate", "gpu_sm", "k3_sp_table_device", "mla_of"]
