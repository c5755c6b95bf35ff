"""vLLM 0.34.0 (its PyPI wheel's sources, diffed against 0.33.0 function by function wherever a record cites
a file): the modes, PP schedule and launch facts read in `tpplan/engines/vllm.py`, and this release's own
scheduler rules (what the serving loop reads), KV sizing (what `tpplan.cost.kv_capacity` computes) and P/D
hand-off (NixlConnector)."""

from __future__ import annotations

from tpplan.engines.schema import (
    BudgetTier,
    DpBeside,
    EngineVersion,
    FabricSharing,
    Fact,
    Gate,
    HandoffRule,
    MicroBatchOverlap,
    ReplicaRouter,
    RouterRule,
    SchedulerRules,
    Source,
    StartupRefusal,
    StepBudget,
    VllmMemory,
)
from tpplan.engines.sparse_mla import VLLM_0_34_0_SPARSE
from tpplan.engines.vllm import (
    NCCL_NVLS,
    PIPELINE,
    PP_SUPPORT,
    REL,
    REPO,
    VERSION,
    VLLM_DP_EP,
    VLLM_MOE_SP,
    VLLM_NO_SP_PASS,
)


def _v(path: str, function: str) -> Source:
    return Source(REPO, f"vllm/{path}", function, REL)


# ---------------------------------------------------------------------------------------------
# The scheduler: how steps are formed (`tpplan.simulate`)

_BUDGET = StepBudget(
    flag="--max-num-batched-tokens",
    tiers=(BudgetTier(70, 2048), BudgetTier(160, 8192), BudgetTier(None, 16384)),
    small_tier_names=("a100", "gb10"),
    fact=Fact(
        "unset, max_num_batched_tokens for the OpenAI server follows the GPU: 16384 at 160 GiB and more, 8192 at "
        "70 GiB and more except A100 and GB10, else 2048 (the LLM class: 16384 / 16384 / 8192); with chunked "
        "prefill on (the default where the model supports it) it is not raised to max_model_len",
        _v("engine/arg_utils.py", "EngineArgs.get_batch_defaults / _set_default_max_num_seqs_and_batched_tokens_args"),
    ),
)

SCHEDULING = SchedulerRules(
    budget=_BUDGET,
    admission=Fact(
        "one token budget per step: running requests first (a partly prefilled prompt continues, decode takes "
        "its tokens), then waiting requests first come first served, each cut to the budget left "
        "(long_prefill_token_threshold 0 by default: no per-request cap)",
        _v("v1/core/sched/scheduler.py", "Scheduler.schedule"),
    ),
    mixes_decode=True,
    prefill_decode=Fact(
        "chunked prefill and decode share each step's budget; running requests (decode) are scheduled before "
        "waiting ones",
        _v("v1/core/sched/scheduler.py", "Scheduler.schedule"),
    ),
    cpu_overlap=True,
    cpu_overlap_under_pp=True,
    cpu_overlap_fact=Fact(
        "async scheduling is on by default where the executor supports it (the multiprocessing and uniprocess "
        "executors, and the Ray executor: RayExecutorV2 subclasses MultiprocExecutor and keeps "
        "supports_async_scheduling True), so the engine core schedules the next step while the current one runs; "
        "with async scheduling max_concurrent_batches is pp_size + 1 (0.34.0 has no V1 model runner)",
        _v("config/vllm.py", "VllmConfig.__post_init__ / max_concurrent_batches"),
    ),
    prefill_graph_tokens=512,
    graph_fact=Fact(
        "CUDA graphs are captured up to max_cudagraph_capture_size = min(2 x max_num_seqs, 512) tokens on "
        "Hopper (1024 on data-centre Blackwell); larger steps run the compiled model without a graph",
        _v("config/vllm.py", "VllmConfig._set_cudagraph_sizes"),
    ),
    max_running=Fact(
        "max_num_seqs unset: 1024 on H100/H200-class GPUs, 256 on others (OpenAI server), at most "
        "max_num_batched_tokens",
        _v("engine/arg_utils.py", "EngineArgs.get_batch_defaults"),
    ),
    decode_step=Fact(
        "the RUNNING requests are scheduled first, each decode request one token of the step's token budget "
        "(an unfinished prompt its next chunk), then the WAITING ones while the budget, max_num_seqs and KV "
        "blocks allow; with PP and async scheduling a request decodes at most once every pp_size steps "
        "(next_decode_eligible_step)",
        _v("v1/core/sched/scheduler.py", "Scheduler.schedule"),
    ),
    replica_routers=(
        ReplicaRouter(
            name="dp:least_loaded",
            rule=RouterRule(
                prefill="least_loaded",
                decode="least_loaded",
                decode_at_prefill_end=False,
                facts=(
                    Fact(
                        "DP replicas (--data-parallel-size, internal load balancer): each request goes to the engine "
                        "of least score = max(client count x the client's own unfinished requests there, the "
                        "coordinator's waiting + running, refreshed every 100 ms), + 6 x waiting x max(0, KV usage - "
                        "0.5); ties to the first from a scan start that moves on one engine per request (modelled: "
                        "one API server, the in-flight count alone)",
                        _v("v1/engine/core_client.py", "DPLBAsyncMPClient.get_core_engine_for_request"),
                    ),
                    Fact(
                        "--data-parallel-size R: R engine cores behind one API server; on a model without MoE they are "
                        "independent (reconfigure_for_independent_dp_rank), on an MoE model each is a "
                        "DPEngineCoreProc whose MoE layers shard over DP x TP (FusedMoEParallelConfig."
                        "flatten_tp_across_dp_and_pcp) and idle ranks run dummy batches: not R separate copies",
                        _v("v1/engine/core.py", "EngineCoreProc.run_engine_core / DPEngineCoreProc"),
                    ),
                ),
            ),
            what="vLLM's DP load balancer, least-loaded (internal, one API server)",
            flags=("--data-parallel-size {replicas}",),
            on_moe="on an MoE model --data-parallel-size shards the MoE layers over DP x TP (DPEngineCoreProc): not "
            "the R separate copies priced",
            across_nodes="across nodes each node takes --data-parallel-size-local (its replicas) and "
            "--data-parallel-address (the first node's), EngineArgs, which tpplan does not write",
        ),
    ),
    not_modelled=(
        "decode tokens share vLLM's step budget with prefill chunks; the loop gives prefill the whole budget, "
        "so under decode load it understates the steps a prompt needs",
    ),
)


# ---------------------------------------------------------------------------------------------
# KV-cache sizing at the launch line's defaults

COMMON_MEMORY_FACTS = (
    Fact(
        "num_blocks = available_memory // bytes_per_block, bytes_per_block = the largest KV-cache group's page "
        "bytes summed over its layers (block_size tokens x per-token bytes per layer); groups of a hybrid share "
        "the blocks",
        _v("v1/core/kv_cache_planning.py", "get_kv_cache_config_from_groups / _get_kv_cache_bytes_per_block"),
    ),
    Fact(
        "KV heads per rank: 1 for MLA (the latent, whole on every rank), else max(1, kv_heads // tp)",
        _v("config/model.py", "ModelConfig.get_num_kv_heads"),
    ),
    Fact(
        "a sliding-window layer holds at most cdiv(min(sliding_window - 1 + tokens in flight, max_model_len), "
        "block_size) + 1 blocks per request (the admission cap; tpplan takes one decode token in flight)",
        _v("v1/kv_cache_interface.py", "SlidingWindowSpec.max_admission_blocks_per_request"),
    ),
    Fact(
        "max_num_seqs unset (OpenAI server): 1024 on GPUs of 70 GiB and more except A100 and GB10 (and at "
        "160 GiB and more), else 256",
        _v("engine/arg_utils.py", "EngineArgs.get_batch_defaults"),
    ),
)
# A P/D server (NixlConnector, the connector tpplan's P/D launch lines print) without an IMEX channel
PD_FABRIC = FabricSharing(
    "NixlConnector",
    0.92,
    (
        Fact(
            "unset, enable_extensible_kv_cache is off where the KV connector exports the cache through FABRIC "
            "handles (KVCacheAccess.EXPORTS_FABRIC) and imex_channel_available() is False (it logs 'Extensible KV "
            "cache off: without an IMEX channel, KV transfers within a host (e.g. NIXL) would lose NVLink'); the "
            "cache is then sized the profiled way (Worker.determine_available_memory, as 0.33.0) at "
            "gpu_memory_utilization 0.92 (CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION); tpplan reads the IMEX "
            "channel from the cluster file (imex_channel; not stated: assumed none)",
            _v("config/vllm.py", "VllmConfig._resolve_extensible_kv_cache"),
        ),
        Fact(
            "NixlConnector (NixlBaseConnector, which NixlPullConnector and NixlPushConnector extend) reports "
            "REGISTERS | EXPORTS_FABRIC (peers within a host map the cache through UCX cuda_ipc) unless "
            "kv_buffer_device is 'cpu'; kv_buffer_device defaults to the platform's device type, 'cuda' "
            "(config/kv_transfer.py kv_buffer_device_default_factory)",
            _v("distributed/kv_transfer/kv_connector/v1/nixl/connector.py", "NixlBaseConnector.kv_cache_access"),
        ),
        Fact(
            "an IMEX channel is available when the process can open a /dev/nvidia-caps-imex-channels/channel* "
            "device (the file alone does not tell: a container's device cgroup can deny it)",
            _v("utils/vmm_driver.py", "imex_channel_available"),
        ),
        Fact(
            "profiled sizing: available KV memory = ceil(total x gpu_memory_utilization) - non_kv_cache_memory - "
            "the CUDA-graph estimate (the function 0.33.0 cites, its arithmetic unchanged)",
            _v("v1/worker/gpu_worker.py", "Worker.determine_available_memory"),
        ),
    ),
)
MEMORY = VllmMemory(
    1.0, True, 64,
    (
        Fact(
            "block_size defaults to 64 (DEFAULT_BLOCK_SIZE); gpu_memory_utilization unset resolves to 1.0 with the "
            "extensible KV cache and 0.92 (DEFAULT_GPU_MEMORY_UTILIZATION) without; unset, "
            "VllmConfig._resolve_extensible_kv_cache (config/vllm.py) turns the extensible cache on on CUDA and ROCm "
            "except with kv_cache_memory_bytes or num_gpu_blocks_override, elastic EP, a connector sharing the cache "
            "through legacy CUDA IPC or a custom memory pool, or a P/D connector exporting it through FABRIC handles "
            "without an IMEX channel (P/D servers, below)",
            _v("config/cache.py", "CacheConfig.resolved_gpu_memory_utilization"),
        ),
        Fact(
            "extensible KV cache bytes = min(requested - non-KV memory used, headroom - margin) - max(transient peak, "
            "torch reserve growth); headroom = free after warm-up and graph capture + the committed KV; margin = "
            "max(1 GiB, 0.75 x transient peak); at utilization 1.0 that is headroom - margin - peak",
            _v("v1/worker/extensible_kv_cache.py", "measure_kv_cache_bytes / measure_kv_cache_blocks"),
        ),
        *COMMON_MEMORY_FACTS,
    ),
    PD_FABRIC,
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# P/D disaggregation: how a request crosses from the prefill server to the decode server

# The P/D proxy vLLM 0.34.0's NixlConnector docs (docs/features/nixl_connector_usage.md, "Proxy Server") launch;
# it is in the repository's tests, not in the wheel: read in the release's source distribution (`pip download
# --no-binary vllm vllm==0.34.0`), whose vllm/_version.py names commit 62d4bc3c.
_PROXY = Source(REPO, "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py",
                "get_next_client / _handle_completions", "0.34.0 (PyPI sdist, commit 62d4bc3c)")  # fmt: skip
ROUTER = RouterRule(
    prefill="round_robin",
    decode="round_robin",
    decode_at_prefill_end=True,
    facts=(
        Fact(
            "one itertools.cycle per pool: a request goes to the next prefill server in turn with max_tokens 1; "
            "when that answers (with kv_transfer_params), to the next decode server in turn",
            _PROXY,
        ),
    ),
)

HANDOFF = HandoffRule(
    decode_first=False, first_token_on_decode=True, push=False, router=ROUTER,
    sources=(
        _v("distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py",
           "NixlPullConnectorScheduler.get_num_new_matched_tokens / update_state_after_alloc"),
        _v("v1/core/sched/scheduler.py", "Scheduler._handle_blocked_waiting_request / _update_waiting_for_remote_kv"),
    ),
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Dual-batch overlap (`--enable-dbo`, plans `+dbo`; the form: `tpplan.engines.overlap`)

VLLM_DBO = MicroBatchOverlap(
    name="dbo",
    engine=f"vLLM {VERSION}",
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
            _v("v1/worker/ubatch_utils.py", "check_ubatch_thresholds"),
        ),
        Gate(
            "the micro-batches yield only inside the MoE all-to-all (DeepEP high-throughput/low-latency, "
            "NIXL EP, naive DP+EP prepare/finalize): without expert parallelism nothing overlaps",
            "server arg",
            ("--enable-expert-parallel", "--all2all-backend"),
            "runs baseline",
            _v("model_executor/layers/fused_moe/prepare_finalize/deepep_ht.py", "dbo_yield_and_switch_* calls"),
        ),
        Gate(
            "every data-parallel rank must agree to split, and the second micro-batch must not be empty",
            "batch",
            (),
            "per batch",
            _v("v1/worker/dp_utils.py", "_post_process_ubatch"),
        ),
    ),
    schedule_source=_v("model_executor/layers/fused_moe/prepare_finalize/deepep_ht.py", "prepare/finalize"),
    split_source=_v("v1/worker/ubatch_utils.py", "maybe_create_ubatch_slices"),
    sms_source=_v("v1/worker/ubatch_utils.py", "create_sm_control_context (VLLM_DBO_COMM_SMS=20)"),
    # DBO runs on the DeepEP prepare/finalize (its gate), whose supports_async is True: _finalize issues the
    # combine (finalize_async), runs the shared experts, then registers the receive hook and yields (dbo_yield)
    shared_experts_source=_v(
        "model_executor/layers/fused_moe/modular_kernel.py",
        "FusedMoEKernelModularImpl._finalize (finalize_async, _maybe_apply_shared_experts, then "
        "dbo_register_recv_hook / dbo_yield)",
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
        source=_v("config/vllm.py", "VllmConfig._get_dbo_unsupported_features / _validate_model_runner"),
        model_source=_v(
            "model_executor/models/interfaces.py",
            "IsHybrid, implemented by KimiK3ForConditionalGeneration / KimiLinearForCausalLM "
            "(models/kimi_k3/nvidia/model.py), Qwen3NextForCausalLM (model_executor/models/qwen3_next.py), "
            "Qwen3_5ForCausalLMBase / Qwen3_5ForConditionalGeneration (models/qwen3_5/nvidia/model.py)",
        ),
    ),
)


# ---------------------------------------------------------------------------------------------
# Attention DP (`--data-parallel-size` at TP 1) beside PP and prefill CP

DP_BESIDE = DpBeside(
    pp=True,
    cp=True,
    ep_spans_cp=True,
    facts=(
        Fact(
            "no argument or config check refuses --data-parallel-size beside --pipeline-parallel-size or "
            "--prefill-context-parallel-size: each DP rank's world is pipeline x tensor x prefill-context parallel "
            "(ParallelConfig.__post_init__) and the launch's data_parallel_size times it (the only joint check: "
            "--nnodes divides that total)",
            _v("engine/arg_utils.py", "EngineArgs.create_engine_config"),
        ),
        Fact(
            "process groups are laid out ExternalDP x DP x PP x PCP x TP; a MoE model's EP group is the DP x PCP x TP "
            "ranks of one PP stage, so each stage's experts see every DP and PCP rank of that stage",
            _v("distributed/parallel_state.py", "initialize_model_parallel"),
        ),
        Fact(
            "the fused MoE shards over DP x PCP x TP ('PCP serves the same function as DP here'): "
            "flatten_tp_across_dp_and_pcp gives dp_size x pcp_size x tp_size ranks",
            _v(
                "model_executor/layers/fused_moe/config.py",
                "FusedMoEParallelConfig.make / flatten_tp_across_dp_and_pcp",
            ),
        ),
        Fact(
            "the V2 model runner agrees each step's padded token count over the DP group on every rank "
            "(dispatch_cg_and_sync_dp, fed the PCP manager's token count), with no PP or PCP condition; "
            "PCPManager.validate_config has no DP condition",
            _v("v1/worker/gpu/model_runner.py", "GPUModelRunner.execute_model (dispatch_cg_and_sync_dp)"),
        ),
    ),
)


BATCH_DEFAULTS = Source(REPO, "vllm/engine/arg_utils.py", "EngineArgs.get_batch_defaults", REL)
VLLM_0_34_0 = EngineVersion(
    engine="vLLM",
    version=VERSION,
    released="current PyPI release (built 2026-11-16); sources read from its wheel, diffed against 0.33.0",
    launcher="vllm serve {model}",
    modes=(VLLM_MOE_SP, VLLM_NO_SP_PASS, VLLM_DP_EP),
    pipeline=PIPELINE,
    notes=(
        "changed from 0.33.0 where tpplan's records cite: ParallelConfig.use_sequence_parallel_moe adds the "
        "`mori` all2all backend; VllmConfig.max_concurrent_batches is pp_size + 1 under async scheduling with no "
        "model-runner condition (0.33.0: only on the V2 model runner, its default); KimiDecoderLayer.__init__ "
        "builds DSA attention for layers a dsa_config names (Kimi-K3's preset has none); the other cited functions "
        "are unchanged or changed without changing what a record states (re-read at 0.34.0, 2026-12-06): "
        "Scheduler.schedule adds an async-KV-load queue used only with --max-num-inflight-kv-loads (default None: "
        "a P/D load still starts only when a running slot is free) and cache-aware admission "
        "(--cache-aware-admission-window, default 0: strict arrival order); VllmConfig._set_cudagraph_sizes changes "
        "only speculative-decoding tiers; MLAAttention.forward_impl moves the decode query's preparation into a "
        "helper (decode tokens still run forward_mqa, prefill tokens forward_mha); kv_cache_planning reads specs "
        "per layer and aligns block strides by their lcm; Worker.execute_model and EngineCore.step_with_batch_queue "
        "drop V1-model-runner branches and wait through _wait_for_output; PassConfig still has no enable_sp",
        "P/D: KVConnectorFactory.get_connector_class now maps NixlConnector to NixlPullConnector unless "
        "kv_connector_extra_config's transfer_mode is 'push' (default 'pull', the hand-off recorded here); "
        "NixlBaseConnector.__init__ warns that kv_role 'kv_both' is deprecated (kv_producer for prefill servers, "
        "kv_consumer for decode servers), as 0.33.0 did",
        "chunked-prefill budget unchanged: --max-num-batched-tokens defaults to 8192 for the API server on GPUs "
        f"of at least 70 GiB other than A100, 16384 from 160 GiB, else 2048 ({BATCH_DEFAULTS.cite()}, the same "
        "function in 0.33.0); Scheduler.schedule now applies long_prefill_token_threshold only with chunked "
        "prefill on",
    ),
    supports=PP_SUPPORT,
    collectives=NCCL_NVLS,
    scheduling=SCHEDULING,
    memory=MEMORY,
    handoff=HANDOFF,
    overlaps=(VLLM_DBO,),
    dp_attention_beside=DP_BESIDE,
    sparse_prefill=VLLM_0_34_0_SPARSE,
)

RELEASES = (VLLM_0_34_0,)
