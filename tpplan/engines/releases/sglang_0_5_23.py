"""SGLang 0.5.23 (its PyPI wheel's sources): the modes, PP schedule and launch facts read in
`tpplan/engines/sglang.py`, and this release's own scheduler rules (what the serving loop reads), KV sizing
(what `tpplan.cost.kv_capacity` computes with `tpplan.engines.memory`'s SGLang formulas) and P/D hand-off."""

from __future__ import annotations

from dataclasses import replace

from tpplan.engines.overlap import SGLANG_TBO
from tpplan.engines.schema import (
    BudgetTier,
    EngineVersion,
    Fact,
    HandoffRule,
    ReplicaRouter,
    RouterRule,
    SchedulerRules,
    SglangMemory,
    Source,
    StepBudget,
)
from tpplan.engines.sglang import (
    NCCL_NVLS,
    PIPELINE,
    PP_REFUSED,
    PP_SUPPORT,
    SGL_DP_ATTENTION,
    SGL_INPUT_SCATTERED,
    SGL_LAYERNORM_SP,
)
from tpplan.engines.sglang_source import REL, rel
from tpplan.engines.sglang_sp_moe import SGL_SP_MOE
from tpplan.engines.sparse_mla import SGLANG_0_5_23_SPARSE


def _srt(path: str, function: str) -> Source:
    return rel(f"python/sglang/srt/{path}", function)


# ---------------------------------------------------------------------------------------------
# The scheduler: how prefill steps are formed (`tpplan.simulate`)

_SGL_BUDGET = StepBudget(
    flag="--chunked-prefill-size",
    tiers=(BudgetTier(20, 2048), BudgetTier(60, 4096), BudgetTier(160, 8192), BudgetTier(None, 16384)),
    small_tier_names=(),
    fact=Fact(
        "unset, chunked_prefill_size follows the GPU's memory (MiB as the device reports it): under 20 GiB 2048, "
        "under 35 GiB and under 60 GiB 4096, under 90 GiB (H100) and under 160 GiB (H200) 8192, else (B200) 16384",
        _srt("arg_groups/memory_hook.py", "handle_gpu_memory_settings"),
    ),
)

SCHEDULING = SchedulerRules(
    budget=_SGL_BUDGET,
    admission=Fact(
        "schedule_policy defaults to fcfs; a step takes the chunked request first, then waiting requests in order "
        "while --chunked-prefill-size tokens (and --max-prefill-tokens, default 16384) remain; the request that does "
        "not fit is truncated and becomes the next step's chunked request",
        _srt("managers/schedule_policy.py", "PrefillAdder.add_one_req / add_chunked_req"),
    ),
    mixes_decode=False,
    prefill_decode=Fact(
        "prefill first: get_next_batch_to_run runs a new prefill batch whenever one can be formed and a decode "
        "batch only otherwise ('Run prefill first if possible'); --enable-mixed-chunk (default off) would mix them",
        _srt("managers/scheduler.py", "Scheduler.get_next_batch_to_run"),
    ),
    cpu_overlap=True,
    cpu_overlap_under_pp=False,
    cpu_overlap_fact=Fact(
        "the overlap schedule is on by default (disable_overlap_schedule False): event_loop_overlap schedules the next "
        "batch while the GPU runs the current one; PP turns it off (_pipeline_parallel_overlap_disable)",
        _srt("managers/scheduler.py", "Scheduler.event_loop_overlap"),
    ),
    prefill_graph_tokens=8192,
    graph_fact=Fact(
        "prefill runs breakable CUDA graphs by default on CUDA (default_prefill_backend BREAKABLE), captured up to "
        "max_bs = chunked_prefill_size (MLA backends: min(8192, chunked_prefill_size)) tokens",
        _srt(
            "model_executor/cuda_graph_config.py",
            "default_prefill_backend; arg_groups/memory_hook.py handle_gpu_memory_settings",
        ),
    ),
    max_running=Fact(
        "--max-running-requests unset: derived from the KV pool (PoolConfigurator); under PP a micro-batch holds at "
        "most pp_max_micro_batch_size = max_running_requests // pp_size requests",
        _srt("model_executor/pool_configurator.py", "_resolve_max_running_requests_per_worker"),
    ),
    more=(
        Fact(
            "with DP attention the per-rank chunked_prefill_size is divided by the attention-DP size",
            _srt("arg_groups/parallel_hook.py", "_handle_data_parallelism"),
        ),
    ),
    decode_step=Fact(
        "a finished prefill batch is merged into the running batch; when no prefill batch forms, the step decodes "
        "one token of every running request (update_running_batch); prefill_decode_interval (default 0) would hold "
        "prefill back for some decode steps",
        _srt("managers/scheduler.py", "Scheduler.get_next_batch_to_run / update_running_batch"),
    ),
    replica_routers=(),  # set below, beside the P/D router they share a policy with
    not_modelled=(
        "decode batches: SGLang runs prefill first, so a waiting prompt never waits for decode, but decode holds "
        "running-request slots and KV that can stop admission (--max-running-requests, the KV pool)",
    ),
)


# ---------------------------------------------------------------------------------------------
# KV-cache sizing at the launch line's defaults

SGL_FRACTION = Fact(
    "mem_fraction_static unset: round((gpu_mem - reserved_mem) / gpu_mem, 3), gpu_mem in MiB as nvidia-smi reports "
    "it; reserved_mem = 512 + 1.5 x max(chunked_prefill_size, 2048) + tp_size x pp_size / 8 x 1024 + the CUDA-graph "
    "reserve, at least 10 GiB on GPUs over 60 GiB, + 2 GiB with the DeepEP all-to-all backend",
    _srt("arg_groups/memory_hook.py", "handle_gpu_memory_settings"),
)
SGL_GRAPH = Fact(
    "CUDA-graph reserve (MiB): decode graphs (on by default, backend full) 2 x decode max_bs; with DP attention "
    "+ 3 x max_bs x attn_dp_size (+ 1.5 x max_bs x attn_dp_size when max_bs > 300); prefill graphs (breakable, "
    "default on CUDA) 8 per captured size, or 1.5 GiB with an MLA backend; decode max_bs unset: 256 at TP < 4 "
    "and 512 at TP >= 4 on GPUs of 60 to 160 GiB",
    _srt("arg_groups/memory_hook.py", "reserve_for_graph_mb / handle_gpu_memory_settings"),
)
SGL_PREFILL_SIZES = Fact(
    "prefill graph sizes: 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256, "
    "4608.. step 512, up to max_bs = chunked_prefill_size (MLA: min(8192, chunked_prefill_size); PP > 1 with the "
    "breakable backend opted in: at most 8192)",
    _srt("arg_groups/cuda_graph_hook.py", "generate_prefill_cuda_graph_batch_sizes"),
)
SGL_PREFILL_OFF = Fact(
    "prefill CUDA graphs are off by default (so they reserve nothing) under PP > 1 (apply_cuda_graph_compatibility: "
    "'PP prefill graph replay is opt-in') and for KDA hybrid linear attention (disable_breakable_cudagraph_if_"
    "incompatible); handle_cuda_graph_config runs before handle_gpu_memory_settings (arg_groups/pipeline.py)",
    _srt(
        "arg_groups/cuda_graph_hook.py", "apply_cuda_graph_compatibility / disable_breakable_cudagraph_if_incompatible"
    ),
)
SGL_POST_CAPTURE = Fact(
    "post-capture KV sizing (which would skip the graph and activation reserve) is off unless "
    "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set",
    _srt("arg_groups/overrides.py", "post_capture_kv_sizing_planned"),
)
SGL_POOL = Fact(
    "KV pool bytes = free memory after loading the weights - pre_model_load_memory x (1 - mem_fraction_static), "
    "where pre_model_load_memory is the free memory measured after parallel init and before loading (so: "
    "pre x mem_fraction_static - weights)",
    _srt("mem_cache/kv_cache_configurator.py", "KVCacheConfigurator._profile_available_bytes"),
)
SGL_CELL = Fact(
    "tokens = pool bytes // cell, floored to the page size; cell per token = layers x (MLA: kv_lora_rank + "
    "qk_rope_head_dim, whole on every rank; else max(1, kv_heads // attn_tp_size) x (head_dim + v_head_dim)) x the "
    "KV dtype's bytes, over the full-attention layers of the rank's PP stage; a hybrid's stage whose full-attention "
    "layers all sit on other PP stages (cell 0) sizes its pool to int64 max (__init__: has_kv_on_another_pp_stage)",
    _srt("model_executor/pool_configurator.py", "DefaultPoolConfigurator._compute_cell_size / calculate_pool_sizes"),
)
SGL_SWA = Fact(
    "sliding-window hybrids: cell = full-layer bytes + swa_full_tokens_ratio (0.8) x SWA-layer bytes per token; the "
    "full pool holds that many tokens, the SWA pool 0.8 times as many",
    _srt("model_executor/pool_configurator.py", "HybridSWAPoolConfigurator._recompute_cell_size / _solve_pool_sizes"),
)
SGL_MAMBA = Fact(
    "linear-attention hybrids: mamba_full_memory_ratio (0.9) / 1.9 of the pool goes to state slots, "
    "K = (budget - per_slot) // per_slot, K + 1 slots are subtracted, the rest is the full-attention KV pool; "
    "max_running_requests <= K // 3 (3 state slots per request with the radix cache on)",
    _srt(
        "mem_cache/kv_cache_configurator.py", "_handle_max_mamba_cache / _calculate_mamba_ratio / resolve_max_num_reqs"
    ),
)
SGL_MAX_RUNNING = Fact(
    "--max-running-requests unset: min(clamp(tokens / context_len x 512, 2048, 4096), tokens // 2) per DP worker; "
    "given: min(it // attn_dp_size, tokens // 2)",
    _srt("mem_cache/kv_cache_configurator.py", "KVCacheConfigurator.resolve_max_num_reqs"),
)
MEMORY = SglangMemory(
    facts=(SGL_FRACTION, SGL_GRAPH, SGL_PREFILL_SIZES, SGL_PREFILL_OFF, SGL_POST_CAPTURE, SGL_POOL, SGL_CELL,
           SGL_SWA, SGL_MAMBA, SGL_MAX_RUNNING),
    swa_full_tokens_ratio=0.8,
    mamba_full_memory_ratio=0.9,
    mamba_slots_per_request=3,  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, radix cache on
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# P/D disaggregation: how a request crosses from the prefill server to the decode server

# The P/D router: sglang-router (its own PyPI package, not in the SGLang wheel), launched as
# `python -m sglang_router.launch_router --pd-disaggregation --prefill URL --decode URL` (SGLang 0.5.23's own
# P/D test fixture, test/server_fixtures/disaggregation_fixture.py, launches it so). Read in the source
# distribution of its newest release, 0.3.2 (`pip download --no-binary sglang-router sglang-router==0.3.2`):
# the Rust crate sgl-model-gateway 0.3.2 with its Python bindings; paths are inside that sdist.
_ROUTER_PY = "sglang-router 0.3.2 (PyPI sdist, its Python bindings)"
_ROUTER_RS = "sglang-router 0.3.2 (PyPI sdist, Rust crate sgl-model-gateway 0.3.2)"
_ROUTER_REPO = "sgl-project/sglang"
ROUTER = RouterRule(
    prefill="cache_aware", decode="cache_aware", decode_at_prefill_end=False, prefill_load_to_end=True,
    facts=(
        Fact("--policy defaults to cache_aware; in P/D mode --prefill-policy and --decode-policy default to None, "
             "which use --policy for that pool; --cache-threshold 0.3, --balance-abs-threshold 64, "
             "--balance-rel-threshold 1.5",
             Source(_ROUTER_REPO, "bindings/python/src/sglang_router/router_args.py",
                    "RouterArgs / RouterArgs.add_cli_args", _ROUTER_PY)),
        Fact("each request picks its prefill worker and its decode worker at once, each pool's policy on its own "
             "workers with the request text (an unset pool policy is the default one)",
             Source(_ROUTER_REPO, "src/routers/http/pd_router.rs",
                    "PDRouter::select_pd_pair / pick_worker_by_policy_arc; PolicyRegistry::get_prefill_policy",
                    _ROUTER_RS)),
        Fact("a request counts in the load of both its prefill and its decode worker until the whole request ends "
             "(both WorkerLoadGuards live until the decode response is read, or its stream is dropped)",
             Source(_ROUTER_REPO, "src/routers/http/pd_router.rs",
                    "PDRouter::execute_dual_dispatch_internal / create_streaming_response (WorkerLoadGuard)",
                    _ROUTER_RS)),
        Fact("cache_aware: if max load - min load > balance_abs and max > min x balance_rel, the least-loaded "
             "worker; else the worker with the longest prefix match if it covers more than cache_threshold of "
             "the text, else the least-loaded worker (the first of the least; the module comment still says the "
             "smallest tree, which the code no longer does)",
             Source(_ROUTER_REPO, "src/policies/cache_aware.rs",
                    "CacheAwarePolicy::select_worker / select_worker_min_load", _ROUTER_RS)),
    ),
)  # fmt: skip

HANDOFF = HandoffRule(
    decode_first=True, first_token_on_decode=False, push=True, chunked_send=True, router=ROUTER,
    sources=(
        Source("sgl-project/sglang", "python/sglang/srt/disaggregation/decode.py",
               "DecodePreallocQueue.pop_preallocated, SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch",
               REL),
        Source("sgl-project/sglang", "python/sglang/srt/disaggregation/prefill.py",
               "PrefillBootstrapQueue.pop_bootstrapped / can_prefill_before_bootstrap", REL),
        Source("sgl-project/sglang", "python/sglang/srt/disaggregation/prefill.py",
               "SchedulerDisaggregationPrefillMixin.process_prefill_chunk / send_kv_chunk (each chunk's pages)", REL),
        Source("sgl-project/sglang", "python/sglang/srt/arg_groups/fields/disagg.py",
               "optimistic_prefill_attempts = 0, disaggregation_decode_allocation_policy = 'early'", REL),
        Source("sgl-project/sglang", "python/sglang/srt/disaggregation/mooncake/conn.py",
               "MooncakeKVManager.transfer_worker / send_kvcache / send_kvcache_slice", REL),
    ),
)  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Replicas: what spreads a deployment's requests over its R replicas (`--router`; `tpplan.engines.routing`)

_ROUTER_CMD = "python -m sglang_router.launch_router --worker-urls <the R servers' URLs> --policy {policy}"
_ROUTER_LAUNCH = Fact(
    "outside P/D the router takes its workers as --worker-urls URL ...; --policy is one of random, round_robin, "
    "cache_aware (the default), power_of_two, manual",
    Source(_ROUTER_REPO, "bindings/python/src/sglang_router/router_args.py", "RouterArgs.add_cli_args", _ROUTER_PY),
)
_CACHE_AWARE = next(f for f in ROUTER.facts if f.text.startswith("cache_aware:"))  # the policy, as P/D reads it
ROUTER_CACHE_AWARE = ReplicaRouter(
    name="sglang-router:cache_aware",
    rule=RouterRule(
        prefill="cache_aware", decode="cache_aware", decode_at_prefill_end=False, facts=(_ROUTER_LAUNCH, _CACHE_AWARE)
    ),
    what="sglang-router, cache-aware (its default --policy)",
    behind=_ROUTER_CMD.format(policy="cache_aware"),
)
_ROUTER_RR = Fact(
    "--policy round_robin: each request to the next healthy worker in turn (an atomic counter mod their count)",
    Source(_ROUTER_REPO, "src/policies/round_robin.rs", "RoundRobinPolicy::select_worker", _ROUTER_RS),
)
ROUTER_ROUND_ROBIN = ReplicaRouter(
    name="sglang-router:round_robin",
    rule=RouterRule(
        prefill="round_robin", decode="round_robin", decode_at_prefill_end=False, facts=(_ROUTER_LAUNCH, _ROUTER_RR)
    ),
    what="sglang-router, round-robin",
    behind=_ROUTER_CMD.format(policy="round_robin"),
)
_DP_NODES = (
    "across nodes --dp-size spreads every DP rank's TP group over all --nnodes (tp x pp / nnodes GPUs per node from "
    "GPU dp_rank x tp x pp: launch_dp_schedulers, launch_tensor_parallel_group), not one replica on GPUs of its own "
    "as priced"
)
_DP_LAUNCH = Fact(
    "--dp-size R without DP attention: one server's DP controller starts R TP groups, each of tp x pp GPUs from "
    "its own base GPU id and with its own NCCL port (PortArgs.init_new: separate copies, experts and all), and "
    "dispatches every request to one of them (launch_dp_schedulers)",
    _srt("managers/data_parallel_controller.py", "DataParallelController.__init__ / launch_dp_schedulers"),
)
DP_ROUND_ROBIN = ReplicaRouter(
    name="dp:round_robin",
    rule=RouterRule(
        prefill="round_robin",
        decode="round_robin",
        decode_at_prefill_end=False,
        facts=(
            Fact(
                "DP replicas (--dp-size): --load-balance-method auto resolves to round_robin outside P/D; the DP "
                "controller sends each request to the next active worker in turn",
                _srt(
                    "managers/data_parallel_controller.py",
                    "handle_load_balance_method (arg_groups/serving_hook.py); "
                    "DataParallelController.round_robin_scheduler",
                ),
            ),
            _DP_LAUNCH,
        ),
    ),
    what="SGLang's DP controller, round-robin (--load-balance-method auto)",
    flags=("--dp-size {replicas}",),
    across_nodes=_DP_NODES,
    alike=ROUTER_ROUND_ROBIN,  # both deal each request to the next replica in turn
)
DP_TOTAL_REQUESTS = ReplicaRouter(
    name="dp:total_requests",
    rule=RouterRule(
        prefill="least_loaded",
        decode="least_loaded",
        decode_at_prefill_end=False,
        ties_rotate=False,
        facts=(
            Fact(
                "--load-balance-method total_requests: the DP rank with the fewest running + waiting requests "
                "(list.index(min): ties to the lowest rank), its count raised by one per dispatch until the "
                "schedulers' load snapshot is read again (at most every 20 ms); modelled: the router's own "
                "requests in flight at each rank, no snapshot lag",
                _srt(
                    "managers/data_parallel_controller.py",
                    "DPBudget.dispatch / DataParallelController.total_requests_scheduler, refresh_load_budget",
                ),
            ),
            _DP_LAUNCH,
        ),
    ),
    what="SGLang's DP controller, fewest requests (--load-balance-method total_requests)",
    flags=("--dp-size {replicas}", "--load-balance-method total_requests"),
    across_nodes=_DP_NODES,
)
REPLICA_ROUTERS = (DP_ROUND_ROBIN, DP_TOTAL_REQUESTS, ROUTER_CACHE_AWARE, ROUTER_ROUND_ROBIN)

SGLANG_0_5_23 = EngineVersion(
    engine="SGLang",
    version="0.5.23",
    released="current PyPI release (2026-10); sources read from its wheel",
    launcher="python -m sglang.launch_server --model-path {model}",
    modes=(SGL_INPUT_SCATTERED, SGL_SP_MOE, SGL_LAYERNORM_SP, SGL_DP_ATTENTION),
    pipeline=PIPELINE,
    supports=(*PP_SUPPORT, *PP_REFUSED),
    collectives=NCCL_NVLS,
    scheduling=replace(SCHEDULING, replica_routers=REPLICA_ROUTERS),
    memory=MEMORY,
    handoff=HANDOFF,
    overlaps=(SGLANG_TBO,),
    sparse_prefill=SGLANG_0_5_23_SPARSE,
)

RELEASES = (SGLANG_0_5_23,)
