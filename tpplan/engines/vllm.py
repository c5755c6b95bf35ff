"""vLLM, as read: the current release (0.34.0, its PyPI wheel's sources), the release before it (0.33.0,
read first; 0.34.0 was diffed against it function by function wherever a record cites a file) and an
older main revision (read through the code index) that still had the sequence-parallelism compile pass.

The records below are 0.34.0's; the versions themselves are modules of `tpplan/engines/releases/`
(`vllm_0_34_0.py` with its scheduler, KV sizing and P/D hand-off; `vllm_0_33_0.py` re-cites these records at
0.33.0 and replaces what differs there: the all2all backend list, the PP batches in flight, the KV sizing)."""

from __future__ import annotations

from tpplan.engines.schema import (
    CollectiveDefault,
    Comm,
    Gate,
    Mode,
    NotWired,
    Op,
    PipelineSchedule,
    Source,
    Support,
    Wiring,
)

REPO = "vllm-project/vllm"
VERSION = "0.34.0"  # the current release; the records below cite it
REL = f"{VERSION} (PyPI wheel)"
REL_33 = "0.33.0 (PyPI wheel)"


def _rel(path: str, function: str) -> Source:
    return Source(REPO, path, function, REL)


def _old(path: str, function: str, commit: str) -> Source:
    return Source(REPO, path, function, f"commit {commit[:8]}")


PAR = _rel("vllm/config/parallel.py", "ParallelConfig.use_sequence_parallel_moe")
DSV2 = "vllm/model_executor/models/deepseek_v2.py"
DS_LAYER = _rel(DSV2, "DeepseekV2DecoderLayer.__init__ / forward")
DS_MODEL = _rel(DSV2, "DeepseekV2Model.forward")
K3_LAYER = _rel("vllm/models/kimi_k3/nvidia/model.py", "KimiDecoderLayer.__init__ (use_sequence_parallel) / forward")
K3_MOE = _rel("vllm/models/kimi_k3/nvidia/model.py", "KimiMoE.forward")
QWEN3_MOE = _rel("vllm/model_executor/models/qwen3_moe.py", "Qwen3MoeSparseMoeBlock.forward")
SP_MOE_BACKENDS = (
    "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
    "flashinfer_nvlink_one_sided", "passthrough", "mori_high_throughput", "mori_low_latency", "mori", "nixl_ep",
)  # fmt: skip
SP_MOE_BACKENDS_0_33 = tuple(b for b in SP_MOE_BACKENDS if b != "mori")  # "mori" is new in 0.34.0

_MOE_SP_GATES = (
    Gate(
        f"--all2all-backend one of {', '.join(SP_MOE_BACKENDS)}",
        "server arg",
        ("--all2all-backend",),
        "runs baseline",
        PAR,
        "vllm_sp_moe_backend",
    ),
    Gate("--enable-expert-parallel", "server arg", ("--enable-expert-parallel",), "runs baseline", PAR),
    Gate("tensor-parallel size > 1", "server arg", ("--tensor-parallel-size",), "runs baseline", PAR, "tp_gt_1"),
    Gate(
        "data-parallel size > 1 (at DP 1 every TP rank dispatches the whole replicated batch)",
        "server arg",
        ("--data-parallel-size",),
        "runs baseline",
        PAR,
        "dp_gt_1",
    ),
    Gate(
        "pipeline-parallel size 1 (DeepseekV2DecoderLayer turns MoE SP off with PP: 'enable SP MoE with PP "
        "after the PP boundary logic can safely send/receive sequence-parallel hidden_states')",
        "server arg",
        ("--pipeline-parallel-size",),
        "runs baseline",
        DS_LAYER,
        "pp_is_1",
    ),
)

VLLM_MOE_SP = Mode(
    name="moe-sp",
    flags=("--enable-expert-parallel", "--all2all-backend deepep_high_throughput"),
    summary="DeepSeek-V2 family MoE layers sequence-parallel: norms and MoE on T/N, attention input all-gathered, "
    "o_proj output reduce-scattered",
    wiring=(
        Wiring(
            model_types=("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32"),
            architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"),
            layers="MoE layers after the first (each entered with T/N rows)",
            dataflow=(
                Op("input_layernorm (fused residual add on the shard)", "T/N"),
                Comm("AG", "normed attention input", "hidden", DS_LAYER),
                Op("MLA attention, o_proj (reduce_results=False)", "T"),
                Comm("RS", "o_proj partial sum, padded to a multiple of TP", "hidden", DS_LAYER),
                Op("post_attention_layernorm, router, shared experts", "T/N"),
                Comm("A2A", "expert dispatch/combine from the rank's own rows", "moe_input", DS_LAYER),
            ),
            plan="sp-moe",
            source=DS_LAYER,
            differences=(
                "dense layers (first_k_dense_replace) are not SP in vLLM: they all-reduce twice; tpplan's `sp-moe` "
                "reduce-scatters and all-gathers them",
                "the first MoE layer after a dense one enters with full rows: no all-gather, norm on every row",
                "before a non-SP layer and before the final norm vLLM all-gathers hidden and residual together "
                "(2 x hidden wide, DeepseekV2Model.forward)",
            ),
        ),
        Wiring(
            model_types=("kimi_k3",),
            architectures=("KimiK3ForConditionalGeneration",),
            layers="every layer, MoE layers entered on the rank's rows; K3's own gate (KimiDecoderLayer.__init__): "
            "PP 1, --enable-expert-parallel, TP > 1, and --moe-backend deep_gemm_mega_moe or DP > 1, without "
            "use_sequence_parallel_moe's all2all-backend list",
            dataflow=(
                Op(
                    "attention-residual aggregation + input_layernorm on the rank's rows (bank on the shard)",
                    "T/N",
                ),
                Comm("AG", "the normed attention input (sp_all_gather, padding removed)", "hidden", K3_LAYER),
                Op("attention (KDA or MLA), o_proj (reduce_results=False)", "T"),
                Comm("RS", "o_proj partial sum, padded to a multiple of TP (sp_reduce_scatter)", "hidden", K3_LAYER),
                Op("post-attention aggregation and norm, router, latent down projection, shared experts", "T/N"),
                Comm("A2A", "expert dispatch/combine of the MoE latent from the rank's rows", "moe_latent", K3_MOE),
            ),
            plan="sp-moe",
            source=K3_LAYER,
            differences=(
                "the dense layer's MLP is replicated and runs on the rank's rows without a collective "
                "(KimiMLP; VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT shards it with an all-gather and a reduce-scatter); "
                "tpplan's `sp-moe` all-gathers its input and reduce-scatters its output",
                "the embedding is all-reduced then sliced (sp_shard, KimiLinearModel.forward); tpplan reduce-scatters "
                "it; the output aggregation runs on the rank's rows and the stream is all-gathered before the final "
                "norm (in compute_logits); tpplan norms the rank's rows",
            ),
        ),
        Wiring(
            model_types=("qwen3_moe",),
            architectures=("Qwen3MoeForCausalLM",),
            layers="MoE layers entered after a MoE layer (the first layer takes the embedding's all-reduce)",
            dataflow=(
                Comm(
                    "AG",
                    "the previous MoE block's output back to every row (tensor_model_parallel_all_gather, padding cut)",
                    "hidden",
                    QWEN3_MOE,
                ),
                Op("input_layernorm (fused residual add), qkv_proj, attention", "T"),
                Comm(
                    "AR",
                    "o_proj partial sum (RowParallelLinear, reduce_results=True: attention is not SP)",
                    "hidden",
                    _rel("vllm/model_executor/models/qwen3_moe.py", "Qwen3MoeAttention.__init__ (o_proj)"),
                ),
                Op("post_attention_layernorm", "T"),
                Op("MoE block: the rank's chunk of the replicated hidden (sequence_parallel_chunk), gate", "T/N"),
                Comm("A2A", "expert dispatch/combine from the chunk", "moe_input", QWEN3_MOE),
            ),
            plan="vllm-moe-chunk",
            source=QWEN3_MOE,
            differences=(
                "the chunk pads T to a multiple of TP and the gather cuts the padding (sequence_parallel_chunk_impl); "
                "tpplan pads its token shard the same way",
            ),
        ),
    ),
    not_wired=(
        NotWired(("qwen3", "llama", "mistral", "qwen2"), "baseline", "dense models have no MoE block to shard", PAR),
    ),
    gates=_MOE_SP_GATES,
    fallback="with a gate off the MoE block keeps replicated tokens (every TP rank dispatches the whole batch) and "
    "the attention all-reduces",
    fallback_source=DS_LAYER,
    derived=("the EP group spans all TP x DP ranks (no separate EP size)",),
)

VLLM_NO_SP_PASS = Mode(
    name="sp-pass",
    flags=("""--compilation-config '{"pass_config": {"enable_sp": true}}'""",),
    summary="the release has no sequence-parallelism compile pass",
    wiring=(),
    not_wired=(),
    gates=(
        Gate(
            "pass_config has no `enable_sp` field in this release and config dataclasses forbid extra fields, so "
            "the compilation config is rejected",
            "server arg",
            ("--compilation-config",),
            "refuses",
            _rel("vllm/config/compilation.py", "PassConfig (@config, extra='forbid' in vllm/config/utils.py)"),
            "never",
        ),
    ),
    fallback="-",
    fallback_source=_rel("vllm/config/compilation.py", "PassConfig"),
    exists=False,
)

VLLM_DP_EP = Mode(
    name="dp-ep",
    flags=("--data-parallel-size <dp>", "--enable-expert-parallel", "--all2all-backend <backend>"),
    summary="attention per DP rank (TP inside each DP group); experts over TP x DP ranks",
    wiring=(
        Wiring(
            model_types=("deepseek_v3", "deepseek_v2", "kimi_k2", "qwen3_moe", "kimi_k3"),
            architectures=(),
            layers="MoE layers",
            dataflow=(
                Op("attention on the DP rank's own requests", "T/N"),
                Comm(
                    "AG",
                    "allgather_reducescatter: all_gatherv of hidden and router logits with per-rank sizes "
                    "(no max-length padding)",
                    "hidden",
                    _rel("vllm/distributed/device_communicators/all2all.py", "AgRsAll2AllManager.dispatch"),
                ),
                Op("experts", "T"),
                Comm(
                    "RS",
                    "reduce_scatterv back to each DP rank's rows",
                    "hidden",
                    _rel("vllm/distributed/device_communicators/all2all.py", "AgRsAll2AllManager.combine"),
                ),
            ),
            plan=None,
            source=_rel("vllm/distributed/device_communicators/all2all.py", "AgRsAll2AllManager"),
            differences=(
                "tpplan's `vllm-dp-ep` (this allgather_reducescatter dataflow with --enable-expert-parallel) and "
                "`vllm-dp` (routed experts TP over the DP ranks; tpplan.plans.named.vllm_dp_ep) run TP 1 per DP rank; "
                "TP > 1 inside a DP rank has no tpplan plan, and DeepEP backends dispatch by all-to-all instead",
            ),
        ),
    ),
    not_wired=(),
    gates=(),
    fallback="-",
    fallback_source=_rel("vllm/forward_context.py", "DPMetadata"),
)

ASYNC_DEFAULT = _rel("vllm/config/vllm.py", "VllmConfig.__post_init__ (async_scheduling None -> True)")
RAY_EXECUTOR = _rel("vllm/v1/executor/ray_executor_v2.py", "RayExecutorV2(MultiprocExecutor) (no override)")
MP_ASYNC = _rel("vllm/v1/executor/multiproc_executor.py", "MultiprocExecutor.supports_async_scheduling -> True")
PIPELINE = PipelineSchedule(
    in_flight="max_concurrent_batches = pipeline_parallel_size + 1 batches in the engine core's batch queue "
    "whenever async scheduling is on (the V1 model runner is gone in 0.34.0), and VllmConfig.__post_init__ turns "
    "it on by default unless the executor does not support it, the model is a pooling model, or ROCm DeepEP "
    "high-throughput DBO runs: the Ray executor (--distributed-executor-backend ray, RayExecutorV2, a "
    "MultiprocExecutor subclass that keeps supports_async_scheduling True) and the multiprocessing executor both "
    "keep it; --no-async-scheduling gives pipeline_parallel_size. step_with_batch_queue schedules a new batch "
    "while the queue has room and otherwise blocks on the oldest, so a batch enters only once the one "
    "pp_size + 1 earlier has finished",
    extra_in_flight=1,
    source=_rel("vllm/config/vllm.py", "VllmConfig.max_concurrent_batches"),
    chunks_of_one_request="they pipeline: Scheduler._update_after_schedule advances num_computed_tokens when a chunk "
    "is scheduled ('allowing us to schedule the prefill request again immediately in the next scheduling step'), so "
    "the next chunk joins the next batch while the previous one is in flight; a batch holds at most "
    "--max-num-batched-tokens, running requests first, then waiting ones first-come first-served",
    chunks_overlap=True,
    chunks_source=_rel("vllm/v1/core/sched/scheduler.py", "Scheduler._update_after_schedule / Scheduler.schedule"),
    boundary="IntermediateTensors point-to-point: Worker.execute_model's isend_tensor_dict(all_gather_group="
    "get_tp_group()) sends each TP rank's 1/N slice of every tensor and the next stage's irecv_tensor_dict "
    "all-gathers it over TP; sequence parallelism is off with PP (DeepSeek-V2 MoE SP requires PP 1; Kimi-K3's "
    "use_sequence_parallel requires pipeline_parallel_size == 1 and asserts 'Currently, SP is not supported with "
    "PP'), so no sequence-parallel shard crosses a boundary",
    boundary_models=(
        (
            ("kimi_k3",),
            "; Kimi-K3 sends hidden_states (its prefix sum folded in) "
            "and, as residual, the [T, ceil(end_layer / block), H] attention-residual bank",
        ),
    ),
    boundary_gathers=True,
    boundary_source=_rel("vllm/v1/worker/gpu_worker.py", "Worker.execute_model"),
    more_sources=(
        _rel("vllm/v1/engine/core.py", "EngineCore.step_with_batch_queue"),
        ASYNC_DEFAULT,
        RAY_EXECUTOR,
        MP_ASYNC,
        _rel(
            "vllm/models/kimi_k3/nvidia/model.py",
            "KimiLinearModel.__init__ (use_sequence_parallel needs pipeline_parallel_size == 1) / forward (asserts "
            "'Currently, SP is not supported with PP'; so in 0.33.0 too)",
        ),
    ),
    not_modelled=(
        "the engine core's CPU time per step (scheduling, output processing) is not priced",
        "--max-num-seqs is taken not to bind: every waiting request fits a batch's token budget",
        "vllm-project/vllm PR 54347 (open, not in 0.33.0 or 0.34.0) would keep Kimi-K3's sequence-parallel shards "
        "across the boundary with no TP all-gather on the receiver (boundary_gathers False would price that)",
    ),
)

# --pipeline-parallel-size: ModelConfig.verify_with_parallel_config refuses PP (NotImplementedError) for a model
# class that does not implement SupportsPP; these tpplan model types' classes do, in 0.33.0 and 0.34.0 (each found
# from the config's architecture through model_executor/models/registry.py; every tpplan model type is here).
# 0.34.0 moved Qwen3.5 to vllm/models/qwen3_5/ (the CUDA entry point); 0.33.0 has it in
# model_executor/models/qwen3_5.py (releases/vllm_0_33_0.py re-cites it).
QWEN3_5_PP = (
    "Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration (extend Qwen3VLForConditionalGeneration)"
)
PP_SUPPORT = tuple(
    Support("--pipeline-parallel-size", types, f"{cls} implements SupportsPP", _rel(path, f"{cls} (SupportsPP)"))
    for types, cls, path in (
        (("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32"), "DeepseekV2ForCausalLM",
         "vllm/model_executor/models/deepseek_v2.py"),
        (("qwen3",), "Qwen3ForCausalLM", "vllm/model_executor/models/qwen3.py"),
        (("qwen3_moe",), "Qwen3MoeForCausalLM", "vllm/model_executor/models/qwen3_moe.py"),
        (("llama",), "LlamaForCausalLM", "vllm/model_executor/models/llama.py"),
        (("kimi_k3",), "KimiK3ForConditionalGeneration", "vllm/models/kimi_k3/nvidia/model.py"),
        (("kimi_linear",), "KimiLinearForCausalLM", "vllm/models/kimi_k3/nvidia/model.py"),
        (("qwen2",), "Qwen2ForCausalLM", "vllm/model_executor/models/qwen2.py"),
        (("mistral",), "MistralForCausalLM (extends LlamaForCausalLM)", "vllm/model_executor/models/mistral.py"),
        (("mixtral",), "MixtralForCausalLM", "vllm/model_executor/models/mixtral.py"),
        (("gemma3",), "Gemma3ForConditionalGeneration", "vllm/model_executor/models/gemma3_mm.py"),
        (("gemma3_text",), "Gemma3ForCausalLM", "vllm/model_executor/models/gemma3.py"),
        (("glm4_moe",), "Glm4MoeForCausalLM", "vllm/model_executor/models/glm4_moe.py"),
        (("glm_moe_dsa",), "DeepseekV32ForCausalLM (GlmMoeDsaForCausalLM on CUDA; extends DeepseekV2ForCausalLM)",
         "vllm/models/deepseek_v32/nvidia/model.py"),
        (("gpt_oss",), "GptOssForCausalLM", "vllm/model_executor/models/gpt_oss.py"),
        (("kimi_k25",), "KimiK25ForConditionalGeneration", "vllm/model_executor/models/kimi_k25.py"),
        (("llama4",), "Llama4ForConditionalGeneration", "vllm/model_executor/models/mllama4.py"),
        (("llama4_text",), "Llama4ForCausalLM (extends LlamaForCausalLM)", "vllm/model_executor/models/llama4.py"),
        (("minimax_m2",), "MiniMaxM2ForCausalLM", "vllm/model_executor/models/minimax_m2.py"),
        (("qwen3_next",), "Qwen3NextForCausalLM", "vllm/model_executor/models/qwen3_next.py"),
        (("qwen3_5", "qwen3_5_moe"), QWEN3_5_PP, "vllm/models/qwen3_5/nvidia/model.py"),
    )
)  # fmt: skip

# vLLM leaves NCCL_NVLS_ENABLE alone on the serving path: the wheel sets it only in batch-invariant mode
# (model_executor/determinism/batch_invariant.py) and, in 0.34.0, the CUDA-checkpoint executor.
NCCL_NVLS = CollectiveDefault(
    setting="NCCL_NVLS_ENABLE",
    nvls=None,
    text="the server does not set NCCL_NVLS_ENABLE (only batch-invariant mode sets it to 0, and in 0.34.0 the "
    "CUDA-checkpoint executor): NCCL's own default applies, NVLS where the system supports multicast",
    enable=(),
    source=_rel("vllm/model_executor/determinism/batch_invariant.py", "grep of the wheel for NCCL_NVLS_ENABLE"),
)

# --------------------------------------------------------------------------------------------
# An older main revision with the compile pass.

OLD_VLLM = "000fc94b754f66aeb60ef5acf1ea2e94cdc65164"
OLD_SP = "7d7e95dc9bb08b248a9baca355347f52a6b27558"
POST_INIT = _old("vllm/config/vllm.py", "VllmConfig.__post_init__", OLD_VLLM)
APPLICABLE = _old(
    "vllm/compilation/passes/fusion/sequence_parallelism.py", "SequenceParallelismPass.is_applicable_for_range", OLD_SP
)
THRESHOLD = Source.unread(
    REPO,
    "vllm/compilation/passes/fusion/sequence_parallelism.py",
    "get_sequence_parallelism_threshold (SP_MIN_HIDDEN_SIZE, SP_MIN_PER_GPU_SIZE_MB)",
    why="000fc94b's VllmConfig._set_compile_ranges calls it when sp_min_token_num is unset (read at that commit), but "
    "its body is in the code index only in copies whose commits the index does not give, with three different tables "
    "(sm90 only; sm100 at 64 MiB; sm100 at 32 MiB; all three agree on sm90: hidden >= 8192, 8 MiB per GPU, so only "
    "a Blackwell verdict depends on which one 000fc94b has), and the one copy at a commit (7d7e95dc) predates it; "
    "no release pins it: the 0.33.0 and 0.34.0 wheels have no sequence_parallelism pass and no enable_sp",
)
VLLM_SP_PASS = Mode(
    name="sp-pass",
    flags=("""--compilation-config '{"pass_config": {"enable_sp": true}}'""",),
    summary="a torch.compile pattern pass rewriting all-reduce + RMSNorm into RS + norm on T/N + AG",
    wiring=(
        Wiring(
            model_types=("qwen3", "llama", "mistral", "qwen2"),
            architectures=("Qwen3ForCausalLM", "LlamaForCausalLM"),
            layers="every all-reduce followed by an RMSNorm (matched at compile time)",
            dataflow=(
                Comm("RS", "block output (the all-reduce it replaced)", "hidden", APPLICABLE),
                Op("input_layernorm (fused residual add)", "T/N"),
                Comm("AG", "normed attention input", "hidden", APPLICABLE),
                Op("qkv_proj, attention, o_proj", "T"),
                Comm("RS", "o_proj partial sum", "hidden", APPLICABLE),
                Op("post_attention_layernorm", "T/N"),
                Comm("AG", "normed MLP input", "hidden", APPLICABLE),
                Op("gate_up_proj, down_proj", "T"),
            ),
            plan="sequence-parallel",
            source=_old(
                "vllm/compilation/passes/fusion/sequence_parallelism.py",
                "MiddleAllReduceRMSNormPattern.replacement",
                OLD_SP,
            ),
        ),
    ),
    not_wired=(),
    gates=(
        Gate(
            "enable_sp is off unless set: every optimization level leaves it False (O0 and O1 False; O2, the "
            "default, and O3 IS_DENSE, a module constant False, 'currently set to False in all cases')",
            "server arg",
            ("--compilation-config", "-O"),
            "runs baseline",
            Source(
                REPO,
                "vllm/config/vllm.py",
                "OPTIMIZATION_LEVEL_00..03 pass_config.enable_sp; IS_DENSE = False; VllmConfig.optimization_level = O2",
                f"commit {OLD_VLLM[:8]}",
            ),
        ),
        Gate(
            "async TP (pass_config.fuse_gemm_comms) forces enable_sp on",
            "server arg",
            ("--compilation-config",),
            "adjusts",
            POST_INIT,
        ),
        Gate(
            "tensor-parallel size > 1, else a warning and SP off",
            "server arg",
            ("--tensor-parallel-size",),
            "runs baseline",
            POST_INIT,
            "tp_gt_1",
        ),
        Gate(
            "batches of at least pass_config.sp_min_token_num tokens; unset, the heuristic computes it (000fc94b's "
            "VllmConfig._set_compile_ranges calls get_sequence_parallelism_threshold; revision 7d7e95dc: no threshold; "
            "later copies: CUDA sm90 hidden >= 8192 and 8 MiB per GPU, sm100 family hidden >= "
            "8192 and 64 then 32 MiB, XPU hidden >= 4096 and 8 MiB); where it returns None vLLM logs a warning "
            "('Model hidden_size too small for the SP threshold heuristic, disabling') and turns SP off",
            "server arg",
            ("--compilation-config",),
            "runs baseline",
            THRESHOLD,
            "vllm_sp_threshold",
        ),
        Gate(
            "VLLM_COMPILE mode (a warning otherwise: the pass runs inside Inductor)",
            "server arg",
            ("--compilation-config", "-O"),
            "runs baseline",
            POST_INIT,
        ),
        Gate(
            "full-graph compilation (no splitting ops), or a single compile size divisible by TP",
            "server arg",
            ("--compilation-config",),
            "runs baseline",
            APPLICABLE,
        ),
    ),
    fallback="where the pattern does not match or a gate is off, the all-reduce stays (warnings as above)",
    fallback_source=POST_INIT,
)

__all__ = [
    "NCCL_NVLS",
    "PIPELINE",
    "PP_SUPPORT",
    "QWEN3_5_PP",
    "REL",
    "REL_33",
    "REPO",
    "SP_MOE_BACKENDS",
    "SP_MOE_BACKENDS_0_33",
    "VERSION",
    "VLLM_DP_EP",
    "VLLM_MOE_SP",
    "VLLM_NO_SP_PASS",
    "VLLM_SP_PASS",
]
