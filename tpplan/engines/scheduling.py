"""How each engine version's scheduler forms prefill steps: what the serving loop (`tpplan.simulate`) takes
from an engine, the step's token budget and how its default is derived from the GPU, the admission order,
whether prefill and decode share a step, whether the CPU schedules the next step while the GPU runs the
current one, and which prefill steps run as a CUDA graph (`tpplan.engines.schema.SchedulerRules`).

Each release states its own rules in its module of `tpplan/engines/releases/` (`EngineVersion.scheduling`);
`tpplan.engines.scheduler_rules(key)` reads them. How PP takes micro-batches is the engine's
`PipelineSchedule` (`tpplan.engines.select(key).pipeline`), not repeated there. docs/engines.md lists each
version's rules; docs/cost-model.md ("Serving loop") says what the loop uses. What both engines do alike
for MLA decode is below, each fact with its source.
"""

from __future__ import annotations

from tpplan.engines.schema import Fact, Source

SGLANG = "sgl-project/sglang"
VLLM = "vllm-project/vllm"


def _sgl(path: str, function: str) -> Source:
    return Source(SGLANG, f"python/sglang/srt/{path}", function, "0.5.23 (PyPI wheel)")


def _vllm(version: str, path: str, function: str) -> Source:
    return Source(VLLM, f"vllm/{path}", function, f"{version} (PyPI wheel)")


MLA_DECODE_ABSORBED = (
    Fact(
        "a step's decode tokens (num_decode_tokens) run forward_mqa, MQA over the cached latent with the key and "
        "value up-projections absorbed into the query and the output; its prefill tokens run forward_mha",
        _vllm("0.34.0", "model_executor/layers/attention/mla_attention.py", "MLAAttention.forward_impl"),
    ),
    Fact(
        "a decode batch (not an extend) dispatches to the absorbed MLA method (_dispatch_mla_subtype); extends "
        "without a prefix, or with prefixes past chunked_prefix_cache_threshold, run MHA",
        _sgl("models/deepseek_common/attention_backend_handler.py", "_handle_attention_backend"),
    ),
)
"""How both engines run MLA attention for decode tokens: what `cost.kernel_pricer` prices them as."""

MLA_DECODE_KERNEL_HOPPER = (
    Fact(
        "with no --attention-backend, an MLA model on Hopper (is_hopper_with_cuda_12_3) gets fa3; DeepSeek-V3's "
        "model override sets trtllm_mla only on SM100, and DSA models (DeepSeek-V3.2, GLM-5.1) get dsa; flashmla "
        "is opt-in (--attention-backend flashmla)",
        _sgl("arg_groups/model_override_base.py", "get_default_attn_backend"),
    ),
    Fact(
        "fa3's MLA decode is FlashAttention 3's flash_attn_with_kvcache with q = the rope query, k_cache = the rope "
        "cache, v_cache = the latent cache and qv = the absorbed nope query (FA3's MLA path, not FlashMLA)",
        _sgl("layers/attention/flashattention_backend.py", "FlashAttentionBackend.forward_decode"),
    ),
    Fact(
        "use_mla on compute capability 9.x: FLASH_ATTN_MLA first, then FLASHMLA, FLASHINFER_MLA, TRITON_MLA "
        "(the sparse backends after them)",
        _vllm("0.34.0", "platforms/cuda.py", "_get_backend_priorities"),
    ),
    Fact(
        "FLASH_ATTN_MLA supports capability major 9 only; its decode calls flash_attn_varlen_func(q=q_pe, "
        "k=k_pe cache, v=latent cache, q_v=q_nope, fa_version=3): FA3's MLA path, not FlashMLA",
        _vllm("0.34.0", "v1/attention/backends/mla/flashattn_mla.py", "FlashAttnMLAImpl.forward_mqa"),
    ),
)
"""Which kernel both engines run by default for dense MLA decode on Hopper: FA3's MLA path (q_v), with FlashMLA
second in vLLM and opt-in in SGLang. docs/benchmarks.md ("MLA decode on Hopper") says why the `decode_mla`
set, fitted on the bench's own kernel, was not refitted on FlashMLA's timings."""

__all__ = ["MLA_DECODE_ABSORBED", "MLA_DECODE_KERNEL_HOPPER"]
