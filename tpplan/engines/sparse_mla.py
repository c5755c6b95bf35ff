"""How each engine runs DeepSeek Sparse Attention's prefill (DeepSeek-V3.2, GLM-5.1: the `attention_sparse` op):
what `cost.sparse_attention` prices it as.

Both engines run a prefill step's sparse MLA in the absorbed MQA form: W_UK is applied to each query (a bmm per
head, nope -> 512), the kernel scores each query's heads against its top-k latent rows (576 wide: 512 latent + 64
rope) and sums 512-wide values, and W_UV takes each head's output back to v_head_dim (a bmm per head);
`kv_b_proj` does not run. Each query's valid top-k count (min(position + 1, top-k)) is passed to the kernel, so it
skips the -1 tail. Short steps run dense per-head MHA instead (the `kv_b_proj` up-projection, then flash attention
over every key): vLLM when the step's longest prefill sequence is at most top-k, SGLang when it is at most a fixed
threshold. The kernels on Hopper at the launch defaults (a bf16 KV cache): SGLang runs FlashMLA's sparse prefill,
padding the heads to 64; vLLM runs FA3's MLA path with one query per sequence, whose 64-row tile holds that
query's heads (the tile rows of vLLM's build not read: upstream's). Both compute at least 64 heads per query.
Blackwell (SGLang pads to 128, other backends) is not distinguished: tpplan's GPU models carry no architecture.
"""

from __future__ import annotations

from tpplan.engines.schema import Fact, Source, SparseMLAPrefill
from tpplan.engines.sglang_source import rel
from tpplan.engines.vllm import REL, REPO


def dense_prefill(rule: SparseMLAPrefill, longest: int, topk: int) -> bool:
    """Whether a prefill step whose longest sequence (cached + new tokens) is `longest` runs dense MHA."""
    limit = topk if rule.dense_max_seq is None else rule.dense_max_seq
    return longest <= limit


def heads_run(rule: SparseMLAPrefill, heads: int) -> int:
    """The query heads the sparse kernel computes for `heads` per rank."""
    return -(-heads // rule.head_multiple) * rule.head_multiple


def _sgl(path: str, function: str) -> Source:
    return rel(f"python/sglang/srt/{path}", function)


def _vllm(path: str, function: str) -> Source:
    return Source(REPO, f"vllm/{path}", function, REL)


_SGL_FORM = Fact(
    "a DSA extend that is not dense runs MLA (handle_attention_dsa reads the backend's use_mha); with a bf16 KV "
    "cache the prefill implementation is flashmla_sparse: the query absorbed per head (torch.bmm of q_nope with "
    "w_kc), FlashMLA's sparse kernel over the latent rows, the output through w_vc (torch.bmm)",
    _sgl(
        "models/deepseek_common/attention_forward_methods/forward_mla.py",
        "DeepseekMLAForwardMixin.forward_absorb_prepare / forward_absorb_core",
    ),
)
_SGL_DEFAULTS = Fact(
    "on Hopper (SM90) a DSA model's kv_cache_dtype 'auto' becomes bfloat16 (fp8_e4m3 only from SM100), and with a "
    "bf16 cache the default DSA prefill backend is flashmla_sparse (decode: fa3); an fp8_e4m3 cache would take "
    "flashmla_kv for both",
    _sgl("arg_groups/overrides.py", "_dsa_kv_cache_dtype_default / _dsa_split_backend_resolution"),
)
_SGL_PAD = Fact(
    "FlashMLA's sparse kernel needs num_heads a multiple of 64 on Hopper (128 on SM100+): q is zero-padded to it; "
    "topk_length (dsa_cache_seqlens_int32, the sequence length clipped to index_topk) lets it skip the -1 tail",
    _sgl("layers/attention/dsa_backend.py", "DeepseekSparseAttnBackend._forward_flashmla_sparse"),
)
_SGL_DENSE = Fact(
    "an extend without speculative decoding runs dense MHA (MHA_ONE_SHOT) on SM90/SM100 when the batch's longest "
    "sequence is at most SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD (EnvInt 2048, environ.py), the KV cache is "
    "bf16 or fp8_e4m3, the sequences fit one chunk and DSA prefill CP is off; decode and verify always run MLA",
    _sgl("layers/attention/dsa_backend.py", "DeepseekSparseAttnBackend.set_dsa_prefill_impl"),
)
SGLANG_0_5_23_SPARSE = SparseMLAPrefill(
    dense_max_seq=2048, head_multiple=64, facts=(_SGL_DEFAULTS, _SGL_FORM, _SGL_PAD, _SGL_DENSE)
)
"""SGLang 0.5.23's DSA prefill at its Hopper defaults (not modelled: the one-chunk and prefill-CP conditions of the
dense rule; a --kv-cache-dtype fp8_e4m3 launch, which runs flashmla_kv)."""

_VLLM_FORM = Fact(
    "sparse MLA prefill tokens run forward_mqa unless _use_sparse_mha: all the step's tokens get the query "
    "absorbed (_prepare_mqa_query: torch.bmm with W_UK_T) and the output through W_UV (_v_up_proj, torch.bmm); "
    "masked MHA needs capability family 100 (_is_masked_mha_available), so on Hopper only the dense rule applies",
    _vllm("model_executor/layers/attention/mla_attention.py", "MLAAttention.forward_impl / _use_sparse_mha"),
)
_VLLM_BACKEND = Fact(
    "on capability 9 the sparse MLA backends are tried in the order FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE, "
    "FLASHINFER_MLA_SPARSE_SM90 (first for a 512-wide head only); FLASH_ATTN_MLA_SPARSE takes a bf16 cache without "
    "DCP (FlashAttnMLASparseBackend.supports_combination), so it is the default",
    _vllm("platforms/cuda.py", "_get_backend_priorities"),
)
_VLLM_FA3 = Fact(
    "FA3's MLA path in the absorbed form: flash_attn_varlen_func with q = q_rope (64) over the rope rows and q_v = "
    "the absorbed q_nope (512) over the latent, v the latent (512); one query per sequence (cu_seqlens_q = arange), "
    "its top-k indices as a page-size-1 block_table and their valid count as seqused_k",
    _vllm("v1/attention/backends/mla/flashattn_mla_sparse.py", "FlashAttnMLASparseImpl._forward_mqa_kernel"),
)
_VLLM_TILE = Fact(
    "FA3's query tile on SM90 for head dim 64 with v 512 is 64 rows, and a varlen call packs a sequence's heads into "
    "those rows (upstream Dao-AILab/flash-attention hopper/tile_size.h tile_size_fwd_sm90, heuristics.h "
    "should_pack_gqa): with one query per sequence, fewer than 64 heads per rank leave rows idle, priced as 64",
    Source.unread(
        "vllm-project/flash-attention",
        "hopper/tile_size.h",
        "the SM90 tile rows of vLLM's FA3 build",
        why="compiled into the wheel (_vllm_fa3_C); the fork's source at the wheel's commit was not read",
    ),
)
_VLLM_DENSE = Fact(
    "use_dense_mha when no hisparse config, sparse_mla_force_mqa off and the step's longest prefill sequence "
    "(prefill_max_seq_len) is at most topk_tokens; forward_mha then runs the dense MLA prefill (kv_b_proj)",
    _vllm("model_executor/layers/attention/sparse_mla_attention.py", "_use_dense_mha_prefill"),
)
VLLM_0_34_0_SPARSE = SparseMLAPrefill(
    dense_max_seq=None, head_multiple=64, facts=(_VLLM_FORM, _VLLM_BACKEND, _VLLM_FA3, _VLLM_TILE, _VLLM_DENSE)
)
"""vLLM 0.34.0's DSA prefill at its Hopper default (a bf16 cache: FLASH_ATTN_MLA_SPARSE). Not priced: FLASHMLA_SPARSE
(an fp8_ds_mla cache or --attention-backend), which pads heads to 64 except its small-head kernel at 8, 16 or 32
heads (flashmla_sparse.py `FlashMLASparseImpl._bf16_flash_mla_kernel`)."""

UNREAD_SPARSE = SparseMLAPrefill(dense_max_seq=0, head_multiple=1)
"""A release whose DSA prefill was not read (`EngineVersion.sparse_prefill` None): priced in the absorbed form,
heads unpadded, never dense, and the op's note says so."""

__all__ = ["SGLANG_0_5_23_SPARSE", "UNREAD_SPARSE", "VLLM_0_34_0_SPARSE", "dense_prefill", "heads_run"]
