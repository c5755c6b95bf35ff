"""How each engine version's scheduler forms prefill steps, as data read from its source.

What the serving loop (`tpplan.simulate`) takes from an engine: the step's token budget and how its
default is derived from the GPU, the admission order, whether prefill and decode share a step,
whether the CPU schedules the next step while the GPU runs the current one, and which prefill steps
run as a CUDA graph. How PP takes micro-batches is the engine's `PipelineSchedule`
(`tpplan.engines.select(key).pipeline`), not repeated here. Every fact cites file, function and
version (`Source`); keys are the engine keys of `tpplan.engines` ("sglang@0.5.23", "vllm@0.34.0").
docs/engines.md renders nothing of this yet; docs/cost-model.md ("Serving loop") says what the loop uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines.schema import Source
from tpplan.errors import TpplanError

SGLANG = "sgl-project/sglang"
VLLM = "vllm-project/vllm"
SGL_REL = "0.5.23 (PyPI wheel)"


def _sgl(path: str, function: str) -> Source:
    return Source(SGLANG, f"python/sglang/srt/{path}", function, SGL_REL)


def _vllm(version: str, path: str, function: str) -> Source:
    return Source(VLLM, f"vllm/{path}", function, f"{version} (PyPI wheel)")


@dataclass(frozen=True)
class Fact:
    """One statement about the scheduler and where it was read."""

    text: str
    source: Source


@dataclass(frozen=True)
class BudgetTier:
    """GPUs with less than `below_gib` of memory (None: any more) get `tokens` per step by default."""

    below_gib: float | None
    tokens: int


@dataclass(frozen=True)
class StepBudget:
    """The step's prefill token budget: its flag and its default, by GPU memory."""

    flag: str
    tiers: tuple[BudgetTier, ...]  # ascending; the first whose bound the GPU is under applies
    small_tier_names: tuple[str, ...]  # GPU names kept on the first tier whatever their memory
    fact: Fact

    def default_tokens(self, memory_gib: float, gpu_name: str = "") -> int:
        """The budget the engine picks when the flag is not given, for a GPU of this memory and name."""
        if any(s in gpu_name.lower() for s in self.small_tier_names):
            return self.tiers[0].tokens
        return next(t.tokens for t in self.tiers if t.below_gib is None or memory_gib < t.below_gib)


@dataclass(frozen=True)
class SchedulerRules:
    """One engine version's prefill scheduling, as the serving loop reads it."""

    key: str
    budget: StepBudget
    admission: Fact  # order and splitting of requests in a step
    mixes_decode: bool  # prefill chunks and decode tokens share a step (decode is not simulated yet)
    prefill_decode: Fact
    cpu_overlap: bool  # at PP 1, the CPU forms step n+1 while the GPU runs step n
    cpu_overlap_fact: Fact
    prefill_graph_tokens: int  # prefill steps of at most this many tokens replay a CUDA graph (0: none)
    graph_fact: Fact
    max_running: Fact
    more: tuple[Fact, ...] = ()
    not_modelled: tuple[str, ...] = ()  # what the loop leaves out for this engine: the memo's conditions
    decode_step: Fact | None = None  # how a request decodes once its prompt is done (the loop's `decode`)


_SGL_BUDGET = StepBudget(
    flag="--chunked-prefill-size",
    tiers=(BudgetTier(20, 2048), BudgetTier(60, 4096), BudgetTier(160, 8192), BudgetTier(None, 16384)),
    small_tier_names=(),
    fact=Fact(
        "unset, chunked_prefill_size follows the GPU's memory (MiB as the device reports it): under 20 GiB 2048, "
        "under 35 GiB and under 60 GiB 4096, under 90 GiB (H100) and under 160 GiB (H200) 8192, else (B200) 16384",
        _sgl("arg_groups/memory_hook.py", "handle_gpu_memory_settings"),
    ),
)

SGLANG_0_5_23 = SchedulerRules(
    key="sglang@0.5.23",
    budget=_SGL_BUDGET,
    admission=Fact(
        "schedule_policy defaults to fcfs; a step takes the chunked request first, then waiting requests in order "
        "while --chunked-prefill-size tokens (and --max-prefill-tokens, default 16384) remain; the request that does "
        "not fit is truncated and becomes the next step's chunked request",
        _sgl("managers/schedule_policy.py", "PrefillAdder.add_one_req / add_chunked_req"),
    ),
    mixes_decode=False,
    prefill_decode=Fact(
        "prefill first: get_next_batch_to_run runs a new prefill batch whenever one can be formed and a decode "
        "batch only otherwise ('Run prefill first if possible'); --enable-mixed-chunk (default off) would mix them",
        _sgl("managers/scheduler.py", "Scheduler.get_next_batch_to_run"),
    ),
    cpu_overlap=True,
    cpu_overlap_fact=Fact(
        "the overlap schedule is on by default (disable_overlap_schedule False): event_loop_overlap schedules the next "
        "batch while the GPU runs the current one; PP turns it off (_pipeline_parallel_overlap_disable)",
        _sgl("managers/scheduler.py", "Scheduler.event_loop_overlap"),
    ),
    prefill_graph_tokens=8192,
    graph_fact=Fact(
        "prefill runs breakable CUDA graphs by default on CUDA (default_prefill_backend BREAKABLE), captured up to "
        "max_bs = chunked_prefill_size (MLA backends: min(8192, chunked_prefill_size)) tokens",
        _sgl(
            "model_executor/cuda_graph_config.py",
            "default_prefill_backend; arg_groups/memory_hook.py handle_gpu_memory_settings",
        ),
    ),
    max_running=Fact(
        "--max-running-requests unset: derived from the KV pool (PoolConfigurator); under PP a micro-batch holds at "
        "most pp_max_micro_batch_size = max_running_requests // pp_size requests",
        _sgl("model_executor/pool_configurator.py", "_resolve_max_running_requests_per_worker"),
    ),
    more=(
        Fact(
            "with DP attention the per-rank chunked_prefill_size is divided by the attention-DP size",
            _sgl("arg_groups/parallel_hook.py", "_handle_data_parallelism"),
        ),
    ),
    decode_step=Fact(
        "a finished prefill batch is merged into the running batch; when no prefill batch forms, the step decodes "
        "one token of every running request (update_running_batch); prefill_decode_interval (default 0) would hold "
        "prefill back for some decode steps",
        _sgl("managers/scheduler.py", "Scheduler.get_next_batch_to_run / update_running_batch"),
    ),
    not_modelled=(
        "decode batches: SGLang runs prefill first, so a waiting prompt never waits for decode, but decode holds "
        "running-request slots and KV that can stop admission (--max-running-requests, the KV pool)",
    ),
)


def _vllm_budget(version: str) -> StepBudget:
    return StepBudget(
        flag="--max-num-batched-tokens",
        tiers=(BudgetTier(70, 2048), BudgetTier(160, 8192), BudgetTier(None, 16384)),
        small_tier_names=("a100", "gb10"),
        fact=Fact(
            "unset, max_num_batched_tokens for the OpenAI server follows the GPU: 16384 at 160 GiB and more, 8192 at "
            "70 GiB and more except A100 and GB10, else 2048 (the LLM class: 16384 / 16384 / 8192); with chunked "
            "prefill on (the default where the model supports it) it is not raised to max_model_len",
            _vllm(
                version,
                "engine/arg_utils.py",
                "EngineArgs.get_batch_defaults / _set_default_max_num_seqs_and_batched_tokens_args",
            ),
        ),
    )


def _vllm_rules(version: str, overlap_text: str) -> SchedulerRules:
    return SchedulerRules(
        key=f"vllm@{version}",
        budget=_vllm_budget(version),
        admission=Fact(
            "one token budget per step: running requests first (a partly prefilled prompt continues, decode takes "
            "its tokens), then waiting requests first come first served, each cut to the budget left "
            "(long_prefill_token_threshold 0 by default: no per-request cap)",
            _vllm(version, "v1/core/sched/scheduler.py", "Scheduler.schedule"),
        ),
        mixes_decode=True,
        prefill_decode=Fact(
            "chunked prefill and decode share each step's budget; running requests (decode) are scheduled before "
            "waiting ones",
            _vllm(version, "v1/core/sched/scheduler.py", "Scheduler.schedule"),
        ),
        cpu_overlap=True,
        cpu_overlap_fact=Fact(
            overlap_text, _vllm(version, "config/vllm.py", "VllmConfig.__post_init__ / max_concurrent_batches")
        ),
        prefill_graph_tokens=512,
        graph_fact=Fact(
            "CUDA graphs are captured up to max_cudagraph_capture_size = min(2 x max_num_seqs, 512) tokens on "
            "Hopper (1024 on data-centre Blackwell); larger steps run the compiled model without a graph",
            _vllm(version, "config/vllm.py", "VllmConfig._set_cudagraph_sizes"),
        ),
        max_running=Fact(
            "max_num_seqs unset: 1024 on H100/H200-class GPUs, 256 on others (OpenAI server), at most "
            "max_num_batched_tokens",
            _vllm(version, "engine/arg_utils.py", "EngineArgs.get_batch_defaults"),
        ),
        decode_step=Fact(
            "the RUNNING requests are scheduled first, each decode request one token of the step's token budget "
            "(an unfinished prompt its next chunk), then the WAITING ones while the budget, max_num_seqs and KV "
            "blocks allow; with PP and async scheduling a request decodes at most once every pp_size steps "
            "(next_decode_eligible_step)",
            _vllm(version, "v1/core/sched/scheduler.py", "Scheduler.schedule"),
        ),
        not_modelled=(
            "decode tokens share vLLM's step budget with prefill chunks; the loop gives prefill the whole budget, "
            "so under decode load it understates the steps a prompt needs",
        ),
    )


VLLM_0_33_0 = _vllm_rules(
    "0.33.0",
    "async scheduling is on by default where the executor supports it (the multiprocessing and uniprocess "
    "executors, and the Ray executor: RayExecutorV2 subclasses MultiprocExecutor and keeps "
    "supports_async_scheduling True), so the engine core schedules the next step while the current one runs; "
    "with async scheduling max_concurrent_batches is pp_size + 1 only on the V2 model runner (the default)",
)
VLLM_0_34_0 = _vllm_rules(
    "0.34.0",
    "async scheduling is on by default where the executor supports it (the multiprocessing and uniprocess "
    "executors, and the Ray executor: RayExecutorV2 subclasses MultiprocExecutor and keeps "
    "supports_async_scheduling True), so the engine core schedules the next step while the current one runs; "
    "with async scheduling max_concurrent_batches is pp_size + 1 (0.34.0 has no V1 model runner)",
)

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

RULES: dict[str, SchedulerRules] = {r.key: r for r in (SGLANG_0_5_23, VLLM_0_33_0, VLLM_0_34_0)}


def scheduler_rules(key: str) -> SchedulerRules:
    """The rules of engine version `key` ("sglang@0.5.23"); a TpplanError naming the versions read."""
    if key not in RULES:
        raise TpplanError(f"engine={key}", "no scheduler rules read for that version", f"use one of {', '.join(RULES)}")
    return RULES[key]


__all__ = ["MLA_DECODE_ABSORBED", "RULES", "BudgetTier", "Fact", "SchedulerRules", "StepBudget", "scheduler_rules"]
