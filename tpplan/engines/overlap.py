"""Micro-batch overlap as the engines schedule it, read from their sources: SGLang's two-batch
overlap (TBO, `--enable-two-batch-overlap`) and vLLM's dual-batch overlap (DBO, `--enable-dbo`).

Both split a prefill batch into two micro-batches and interleave them stage by stage on one compute
stream, so that one micro-batch's MoE all-to-all (dispatch, combine) runs on the communication SMs
while the other computes. A MoE layer is three stages per micro-batch, cut at the all-to-all:

    stage 0: attention side ... router, then launch the dispatch      (SGLang: op_dispatch_a)
    stage 1: wait for the dispatch, routed experts, launch the combine (op_dispatch_b .. op_combine_a)
    stage 2: shared experts, wait for the combine, the layer output    (op_shared_experts .. op_output)

run in the order A0 B0 A1 B1 A2 B2 (stage 2 of one layer runs on into stage 0 of the next). The
pricer (`tpplan.cost.overlap`) simulates that order; this module holds what the engines do, with
their sources, for the audit, the prediction and the memo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpplan.engines import sglang_source, vllm
from tpplan.engines.schema import Gate, Source
from tpplan.mesh import Mesh


def _sgl(path: str, function: str) -> Source:
    return Source(sglang_source.REPO, f"python/sglang/srt/{path}", function, sglang_source.REL)


def _vllm(path: str, function: str) -> Source:
    return Source(vllm.REPO, f"vllm/{path}", function, vllm.REL)


DEEPEP_SMS = Source("deepseek-ai/DeepEP", "deep_ep/buffer.py", "Buffer.num_sms = 20", "commit 04b06f7a")

# The model files whose forward calls model_forward_stages in 0.5.23 (grep of the wheel): deepseek_v2,
# qwen2_moe (Qwen3-MoE's model class inherits it), glm4_moe, glm4_moe_lite, glm5_next, mimo_v2,
# minimax_m2, minimax_m3, dots3_common. No other model splits a batch for TBO.
STAGED_CALLERS = _sgl("batch_overlap/two_batch_overlap.py", "model_forward_stages (its callers in models/)")

DenseLayers = Literal["whole batch", "two halves in turn"]


@dataclass(frozen=True)
class StartupRefusal:
    """Deployments an engine refuses a micro-batch overlap for when the server starts (a ValueError)."""

    axes: tuple[Literal["pp", "cp"], ...]  # PP > 1 / prefill CP > 1 beside the flag
    axis_words: tuple[str, ...]  # the engine's words for each axis, in `axes` order
    model_types: tuple[str, ...]  # tpplan model types whose engine class the flag is refused for
    model_words: str  # the engine's words for those models
    source: Source  # where the check is
    model_source: Source  # where those model classes say what makes them refused

    def reason(self, model_type: str, mesh: Mesh) -> str | None:
        """Why the server refuses the flag on `mesh` for `model_type` (None: it does not, as read)."""
        sizes = {"pp": mesh.pp, "cp": mesh.cp}
        found = [w for axis, w in zip(self.axes, self.axis_words, strict=True) if sizes[axis] > 1]
        if model_type in self.model_types:
            found.append(f"{self.model_words} ({model_type}: {self.model_source.cite()})")
        if not found:
            return None
        return f"the server refuses it at startup, 'does not support: {', '.join(found)}' ({self.source.cite()})"


@dataclass(frozen=True)
class MicroBatchOverlap:
    """One engine's micro-batch overlap: where it applies, how it splits, what it costs the GEMMs."""

    name: Literal["tbo", "dbo"]  # the plan suffix: `<plan>+tbo`, `<plan>+dbo`
    engine: str  # "SGLang 0.5.23"
    flags: tuple[str, ...]  # what the launch line adds
    model_types: tuple[str, ...] | None  # whose MoE layers run the staged path (None: every MoE model)
    raises_for: tuple[str, ...]  # models whose forward asks for the staged path and gets an error
    dense_layers: DenseLayers  # SGLang runs dense layers on the whole batch; vLLM runs both halves in turn
    split: str  # how a prefill batch splits into the two micro-batches
    balance: float | None  # split between requests unless a side then holds less than this share; None: midpoint
    min_tokens: int  # a batch with fewer tokens runs whole (no overlap)
    comm_sms: int  # SMs the all-to-all kernels hold; DeepGEMM kernels run on the rest
    shared_experts_before_combine_wait: bool  # stage 2 computes the shared experts before waiting
    gates: tuple[Gate, ...]
    schedule_source: Source  # the stage list
    split_source: Source
    sms_source: Source
    assumption: str = ""  # what tpplan assumes where the source was not read
    # What the server refuses at startup beside the flag: PP > 1 ("pp"), prefill CP > 1 ("cp"), and these
    # model types (e.g. vLLM's hybrid model classes); None: not read for this engine
    refused: StartupRefusal | None = None

    def wires(self, model_type: str) -> bool:
        return self.model_types is None or model_type in self.model_types

    def refusal(self, model_type: str) -> str | None:
        """Why this engine does not overlap `model_type`'s micro-batches, with the source (None: it does)."""
        if self.wires(model_type):
            return None
        gate = next(g for g in self.gates if g.effect == "asserts")
        if model_type in self.raises_for:
            return f"its forward stages {model_type}'s layers and raises NotImplementedError ({gate.source.cite()})"
        return f"its {model_type} forward never splits the batch, so the flag changes nothing ({STAGED_CALLERS.cite()})"

    def refusal_on(self, model_type: str, mesh: Mesh) -> str | None:
        """`refusal`, and why the server refuses the flag on this deployment at startup (None: neither)."""
        why = self.refusal(model_type)
        if why is None and self.refused is not None:
            why = self.refused.reason(model_type, mesh)
        return why


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
)

VLLM_DBO = MicroBatchOverlap(
    name="dbo",
    engine=f"vLLM {vllm.VERSION}",
    flags=("--enable-dbo",),
    model_types=None,  # the yields live in the fused-MoE all-to-all, not in a model class
    raises_for=(),
    dense_layers="two halves in turn",
    split="at the token midpoint of the padded batch (a request may be cut in two)",
    balance=None,
    min_tokens=512,  # dbo_prefill_token_threshold
    comm_sms=20,  # VLLM_DBO_COMM_SMS
    shared_experts_before_combine_wait=True,
    gates=(
        Gate(
            "a batch with prefills overlaps only from dbo_prefill_token_threshold tokens (default 512)",
            "batch",
            ("--dbo-prefill-token-threshold",),
            "per batch",
            _vllm("v1/worker/ubatch_utils.py", "check_ubatch_thresholds"),
        ),
        Gate(
            "the micro-batches yield only inside the MoE all-to-all (DeepEP high-throughput/low-latency, "
            "NIXL EP, naive DP+EP prepare/finalize): without expert parallelism nothing overlaps",
            "server arg",
            ("--enable-expert-parallel", "--all2all-backend"),
            "runs baseline",
            _vllm("model_executor/layers/fused_moe/prepare_finalize/deepep_ht.py", "dbo_yield_and_switch_* calls"),
        ),
        Gate(
            "every data-parallel rank must agree to split, and the second micro-batch must not be empty",
            "batch",
            (),
            "per batch",
            _vllm("v1/worker/dp_utils.py", "_post_process_ubatch"),
        ),
    ),
    schedule_source=_vllm("model_executor/layers/fused_moe/prepare_finalize/deepep_ht.py", "prepare/finalize"),
    split_source=_vllm("v1/worker/ubatch_utils.py", "maybe_create_ubatch_slices"),
    sms_source=_vllm("v1/worker/ubatch_utils.py", "create_sm_control_context (VLLM_DBO_COMM_SMS=20)"),
    assumption=(
        "where vLLM runs the shared experts relative to the combine was not read: tpplan places them as "
        "SGLang does (before the combine wait)"
    ),
    # VllmConfig._validate_model_runner raises "The GPU model runner does not support: dual batch overlap
    # with ..." (use_ubatching is on with --enable-dbo); multimodal, encoder-only, LoRA and PIECEWISE graphs too
    refused=StartupRefusal(
        axes=("pp", "cp"),
        axis_words=(
            "dual batch overlap with pipeline parallelism",
            "dual batch overlap with prefill context parallelism",
        ),
        model_types=("kimi_k3", "kimi_linear", "qwen3_next", "qwen3_5", "qwen3_5_moe"),
        model_words="dual batch overlap with hybrid models",
        source=_vllm("config/vllm.py", "VllmConfig._get_dbo_unsupported_features / _validate_model_runner"),
        model_source=_vllm(
            "model_executor/models/interfaces.py",
            "IsHybrid, implemented by KimiK3ForConditionalGeneration / KimiLinearForCausalLM "
            "(models/kimi_k3/nvidia/model.py), Qwen3NextForCausalLM (model_executor/models/qwen3_next.py), "
            "Qwen3_5ForCausalLMBase / Qwen3_5ForConditionalGeneration (models/qwen3_5/nvidia/model.py)",
        ),
    ),
)

OVERLAPS: dict[str, MicroBatchOverlap] = {o.name: o for o in (SGLANG_TBO, VLLM_DBO)}


def overlap_named(name: str) -> MicroBatchOverlap:
    """The engine overlap a plan suffix names (`tbo`, `dbo`)."""
    return OVERLAPS[name]
