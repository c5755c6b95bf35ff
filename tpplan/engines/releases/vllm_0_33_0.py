"""vLLM 0.33.0 (its PyPI wheel's sources, read first): 0.34.0's records re-cited where the diff found the cited
functions unchanged, with 0.33.0's own all2all backend list, PP in-flight rule, async-scheduling wording and KV
sizing (gpu_memory_utilization 0.92, block 16, profiled). Its P/D hand-off was not read (None: the current
release's rule is used, with a note saying so)."""

from __future__ import annotations

from dataclasses import replace

from tpplan.engines.releases.vllm_0_34_0 import COMMON_MEMORY_FACTS, VLLM_0_34_0
from tpplan.engines.schema import (
    EngineVersion,
    Fact,
    MicroBatchOverlap,
    Source,
    StartupRefusal,
    Support,
    VllmMemory,
    recite,
)
from tpplan.engines.vllm import REL, REL_33, REPO, SP_MOE_BACKENDS_0_33


def _v(path: str, function: str) -> Source:
    return Source(REPO, f"vllm/{path}", function, REL_33)


OVERLAP = Fact(
    "async scheduling is on by default where the executor supports it (the multiprocessing and uniprocess "
    "executors, and the Ray executor: RayExecutorV2 subclasses MultiprocExecutor and keeps "
    "supports_async_scheduling True), so the engine core schedules the next step while the current one runs; "
    "with async scheduling max_concurrent_batches is pp_size + 1 only on the V2 model runner (the default)",
    _v("config/vllm.py", "VllmConfig.__post_init__ / max_concurrent_batches"),
)

MEMORY = VllmMemory(
    0.92, False, 16,
    (
        Fact("gpu_memory_utilization defaults to 0.92; block_size to 16 (DEFAULT_BLOCK_SIZE)",
             _v("config/cache.py", "CacheConfig")),
        Fact(
            "available KV memory = ceil(total x gpu_memory_utilization) - non_kv_cache_memory - the CUDA-graph "
            "estimate (utils/mem_utils.py memory_profiling: non_kv_cache_memory = memory consumed since start "
            "(weights, non-torch memory such as NCCL) + "
            "the profiled transient activation peak; CUDA-graph memory is estimated by a capture pass "
            "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1))",
            _v("v1/worker/gpu_worker.py", "Worker.determine_available_memory"),
        ),
        *recite(COMMON_MEMORY_FACTS, REL, REL_33),
    ),
)  # fmt: skip


def _release_0_33() -> EngineVersion:
    """0.34.0's release re-cited at 0.33.0 with what differs there replaced."""
    old = recite(VLLM_0_34_0, REL, REL_33)
    moe_sp = old.mode("moe-sp")
    assert moe_sp is not None
    backends = replace(moe_sp.gates[0], text=f"--all2all-backend one of {', '.join(SP_MOE_BACKENDS_0_33)}")
    moe_sp = replace(moe_sp, gates=(backends, *moe_sp.gates[1:]))
    v1_runner = Source(REPO, "vllm/config/vllm.py", "VllmConfig.__post_init__ (v1_async_sched_incompat)", REL_33)
    pipeline = replace(
        old.pipeline,
        in_flight="max_concurrent_batches = pipeline_parallel_size + 1 batches in the engine core's batch queue "
        "when async scheduling runs on the V2 model runner, which is the default (use_v2_model_runner, unless "
        "VLLM_USE_V2_MODEL_RUNNER=0 or a feature it lacks); VllmConfig.__post_init__ turns async scheduling on for "
        "every executor that supports it, the Ray executor included (RayExecutorV2 is a MultiprocExecutor "
        "subclass that keeps supports_async_scheduling True); on the V1 model runner PP turns async scheduling "
        "off and pipeline_parallel_size batches are in flight; step_with_batch_queue schedules a new batch while "
        "the queue has room and otherwise blocks on the oldest; the V0 engine's virtual engines are gone (no "
        "virtual_engine anywhere in the 0.33.0 wheel)",
        more_sources=(*old.pipeline.more_sources, v1_runner),
        not_modelled=(
            "the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) keeps pipeline_parallel_size batches in flight "
            "under PP (async scheduling off)",
            *old.pipeline.not_modelled,
        ),
    )
    assert old.scheduling is not None
    return replace(
        old,
        version="0.33.0",
        released="previous PyPI release (built 2026-11-01); sources read from its wheel",
        modes=(moe_sp, *old.modes[1:]),
        pipeline=pipeline,
        notes=(),
        scheduling=replace(old.scheduling, cpu_overlap_fact=OVERLAP),
        memory=MEMORY,
        handoff=None,
        overlaps=(_dbo_0_33(old.overlaps[0]),),
        dp_attention_beside=None,  # read at 0.34.0 only
        supports=tuple(_qwen3_5_at_0_33(s) for s in old.supports),
    )


def _qwen3_5_at_0_33(support: Support) -> Support:
    """0.33.0 has Qwen3.5's classes in model_executor/models/qwen3_5.py (0.34.0 moved them to vllm/models/qwen3_5/);
    they extend Qwen3VLForConditionalGeneration, which implements SupportsPP, in both."""
    if "qwen3_5" not in support.model_types:
        return support
    return replace(support, source=_v("model_executor/models/qwen3_5.py", support.source.function))


V1_FALLBACK = _v("config/vllm.py", "VllmConfig.use_v2_model_runner / _get_dbo_unsupported_features")


def _dbo_0_33(dbo: MicroBatchOverlap) -> MicroBatchOverlap:
    """0.34.0's DBO re-cited (ubatch_utils, dp_utils and the DeepEP prepare/finalize the record cites are unchanged in
    0.33.0) with 0.33.0's model-runner choice: --enable-dbo alone runs on the V1 model runner, which starts beside PP
    and hybrid models and refuses only prefill CP; VLLM_USE_V2_MODEL_RUNNER=1 would add 0.34.0's refusals."""
    return replace(
        dbo,
        engine="vLLM 0.33.0",
        refused=StartupRefusal(
            axes=("cp",),
            axis_words=("prefill context parallel",),
            model_types=(),
            model_words="",
            source=_v(
                "config/vllm.py", "VllmConfig._validate_v1_model_runner / _get_v1_model_runner_unsupported_features"
            ),
            model_source=V1_FALLBACK,
        ),
        runs_on=(
            "vLLM 0.33.0 runs --enable-dbo on its V1 model runner: with VLLM_USE_V2_MODEL_RUNNER unset, "
            "_get_dbo_unsupported_features lists 'dual batch overlap' for the V2 runner, so use_v2_model_runner "
            "falls back to V1 with a warning (not a refusal) and the V1 GPUModelRunner wraps the model in "
            "UBatchWrapper; the V1 runner turns async scheduling off under PP (pp_size batches in flight, not the "
            "V2 runner's pp_size + 1 that tpplan prices for 0.33.0) and refuses prefill CP. Setting "
            "VLLM_USE_V2_MODEL_RUNNER=1 keeps the V2 runner, which then refuses DBO beside PP, decode or prefill CP, "
            "LoRA, speculative decoding, multimodal and hybrid models (the config checks were read; how the V1 "
            "runner's micro-batches run beside PP or a hybrid model's recurrent state was not)"
        ),
        runs_on_source=V1_FALLBACK,
    )


VLLM_0_33_0 = _release_0_33()
RELEASES = (VLLM_0_33_0,)
