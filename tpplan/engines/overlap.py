"""Micro-batch overlap as the engines schedule it, read from their sources: SGLang's two-batch
overlap (TBO, `--enable-two-batch-overlap`) and vLLM's dual-batch overlap (DBO, `--enable-dbo`).

Both split a prefill batch into two micro-batches and interleave them stage by stage on one compute
stream, so that one micro-batch's MoE all-to-all (dispatch, combine) runs on the communication SMs
while the other computes. A MoE layer is three stages per micro-batch, cut at the all-to-all:

    stage 0: attention side ... router, then launch the dispatch      (SGLang: op_dispatch_a)
    stage 1: wait for the dispatch, routed experts, launch the combine (op_dispatch_b .. op_combine_a)
    stage 2: shared experts, wait for the combine, the layer output    (op_shared_experts .. op_output)

run in the order A0 B0 A1 B1 A2 B2 (stage 2 of one layer runs on into stage 0 of the next). The
pricer (`tpplan.cost.overlap`) simulates that order. The form of what the engines do is
`tpplan.engines.schema.MicroBatchOverlap`; this module holds SGLang 0.5.23's TBO; each release module of
`tpplan/engines/releases/` states its own records (`EngineVersion.overlaps`: vLLM 0.34.0's DBO and
0.33.0's differ in what the server refuses and which model runner runs it), each with its sources, for the
audit, the prediction and the memo (`tpplan.engines.overlaps(key)`; `overlap_named`: the default release's).
"""

from __future__ import annotations

from tpplan.engines import sglang_source
from tpplan.engines.schema import Gate, MicroBatchOverlap, Source, StartupRefusal


def _sgl(path: str, function: str) -> Source:
    return Source(sglang_source.REPO, f"python/sglang/srt/{path}", function, sglang_source.REL)


DEEPEP_SMS = Source("deepseek-ai/DeepEP", "deep_ep/buffer.py", "Buffer.num_sms = 20", "commit 04b06f7a")

# The model files whose forward calls model_forward_stages in 0.5.23 (grep of the wheel): deepseek_v2,
# qwen2_moe (Qwen3-MoE's model class inherits it), glm4_moe, glm4_moe_lite, glm5_next, mimo_v2,
# minimax_m2, minimax_m3, dots3_common. No other model splits a batch for TBO.
STAGED_CALLERS = _sgl("batch_overlap/two_batch_overlap.py", "model_forward_stages (its callers in models/)")

SGLANG_TBO = MicroBatchOverlap(
    name="tbo",
    engine="SGLang 0.5.23",
    flags=("--enable-two-batch-overlap",),
    # OperationsStrategy.init_new_tbo dispatches on the decoder layer's class name: DeepseekV2DecoderLayer
    # (DeepSeek-V2/V3, Kimi-K2: DeepseekV3ForCausalLM), Qwen3MoeDecoderLayer, MiMoV2 and DeepSeek-V4;
    # any other class raises NotImplementedError there.
    # DeepSeek-V3.2 (DeepseekV32ForCausalLM) shares the layer class; TBO is refused only with DSA index-top-k
    # sharing (model_hook._validate_dsa_tbo_index_sharing), which its config does not use.
    model_types=("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "qwen3_moe"),
    # These models' forwards call model_forward_stages with their own layer class (glm4_moe.py, minimax_m2.py):
    # init_new_tbo has no strategy for it. Every other model's forward never splits the batch.
    raises_for=("glm4_moe", "glm_moe_dsa", "minimax_m2"),
    dense_layers="whole batch",
    split=(
        "by requests at the balanced token sum; when that leaves either side outside 48-52% of the tokens "
        "(tbo_token_distribution_threshold 0.48), at the token midpoint, one request cut in two"
    ),
    balance=0.48,  # tbo_token_distribution_threshold's default (server_args)
    min_tokens=2,
    comm_sms=20,
    shared_experts_before_combine_wait=True,
    gates=(
        Gate(
            "refused when --moe-a2a-backend is none and attention DP is off (attn_dp_size 1, no EP scale "
            "joiner): it needs an all-to-all MoE backend or attention DP (the non-EP DP TP-MoE path, "
            "DeepSeek-V4's, which overlaps the DP all_gatherv / reduce_scatterv)",
            "server arg",
            ("--enable-two-batch-overlap", "--moe-a2a-backend", "--attn-dp-size", "--enable-dp-attention"),
            "refuses",
            _sgl("arg_groups/validation_hook.py", "check_two_batch_overlap"),
        ),
        Gate(
            "--moe-a2a-backend megamoe has no dispatch/combine split for TBO",
            "server arg",
            ("--moe-a2a-backend",),
            "refuses",
            _sgl("arg_groups/mega_moe_hook.py", "check_mega_moe_compat"),
        ),
        Gate(
            "--moe-a2a-backend deepep_v2 has no TBO hooks yet",
            "server arg",
            ("--moe-a2a-backend",),
            "refuses",
            _sgl("arg_groups/moe_hook.py", "(DeepEP v2 MoE checks)"),
        ),
        Gate(
            "a prefill batch with DeepEP in low-latency mode runs without TBO (prefill resolves `auto` to normal)",
            "batch",
            ("--deepep-mode",),
            "per batch",
            _sgl("batch_overlap/two_batch_overlap.py", "TboDPAttentionPreparer.prepare_all_gather"),
        ),
        Gate(
            "only the MoE layers run staged: dense layers before first_k_dense_replace run the whole batch",
            "model",
            (),
            "per batch",
            _sgl("models/deepseek_v2.py", "DeepseekV2Model.forward (normal_end_layer)"),
        ),
        Gate(
            "a model whose forward stages its layers with a class outside DeepseekV2/Qwen3Moe/MiMoV2/"
            "DeepSeek-V4 (GLM-4.5/5, MiniMax-M2) raises NotImplementedError; other models never split the batch",
            "model",
            (),
            "asserts",
            _sgl("batch_overlap/operations_strategy.py", "OperationsStrategy.init_new_tbo"),
        ),
    ),
    schedule_source=_sgl("batch_overlap/operations_strategy.py", "_compute_moe_deepseek_blog_prefill"),
    split_source=_sgl("batch_overlap/two_batch_overlap.py", "_split_extend_seqs, compute_split_token_index"),
    sms_source=_sgl("batch_overlap/operations_strategy.py", "deep_gemm_num_sms = SMs - DeepEPConfig.num_sms"),
    staged_source=STAGED_CALLERS,
)

__all__ = ["DEEPEP_SMS", "SGLANG_TBO", "STAGED_CALLERS", "MicroBatchOverlap", "StartupRefusal"]
