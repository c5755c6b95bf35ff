"""How each engine version sizes its KV cache, as data and small pure formulas read from its source.

SGLang 0.5.23 derives `mem_fraction_static` from the GPU's memory, the chunked-prefill size, TP x PP and
its CUDA-graph settings before it starts (`handle_gpu_memory_settings`), measures free memory before
loading the weights and gives the KV pool what is free after loading less the non-static share of that
measure (`_profile_available_bytes`), and divides it by a per-token cell (`_compute_cell_size`).
vLLM profiles a forward pass: 0.33.0 takes `gpu_memory_utilization` (0.92) of the card less the weights,
the activation peak, non-torch memory and CUDA-graph memory (`determine_available_memory`); 0.34.0 sizes
an extensible KV cache from what is free after warm-up and graph capture, less a margin and the
activation peak (`measure_kv_cache_bytes`), and divides by the bytes per block.

The formulas here take numbers (MiB, bytes, tokens); `tpplan.cost.kv_capacity` feeds them the cost
model's per-rank weights, activations, KV bytes per token and recurrent state. Every fact cites file,
function and version (`Fact`, `Source`). Planner-level: no torch, no cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpplan.engines.scheduling import Fact, scheduler_rules
from tpplan.engines.schema import Source
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

SGL = "sgl-project/sglang"
VLLM = "vllm-project/vllm"
SGL_REF = "0.5.23 (PyPI wheel)"
MIB = 2**20
GIB = 2**30


def _sgl(path: str, function: str) -> Source:
    return Source(SGL, f"python/sglang/srt/{path}", function, SGL_REF)


def _vllm(version: str, path: str, function: str) -> Source:
    return Source(VLLM, f"vllm/{path}", function, f"{version} (PyPI wheel)")


# ---------------------------------------------------------------------------------------------
# SGLang 0.5.23

SGL_FRACTION = Fact(
    "mem_fraction_static unset: round((gpu_mem - reserved_mem) / gpu_mem, 3), gpu_mem in MiB as nvidia-smi reports "
    "it; reserved_mem = 512 + 1.5 x max(chunked_prefill_size, 2048) + tp_size x pp_size / 8 x 1024 + the CUDA-graph "
    "reserve, at least 10 GiB on GPUs over 60 GiB, + 2 GiB with the DeepEP all-to-all backend",
    _sgl("arg_groups/memory_hook.py", "handle_gpu_memory_settings"),
)
SGL_GRAPH = Fact(
    "CUDA-graph reserve (MiB): decode graphs (on by default, backend full) 2 x decode max_bs; with DP attention "
    "+ 3 x max_bs x attn_dp_size (+ 1.5 x max_bs x attn_dp_size when max_bs > 300); prefill graphs (breakable, "
    "default on CUDA) 8 per captured size, or 1.5 GiB with an MLA backend; decode max_bs unset: 256 at TP < 4 "
    "and 512 at TP >= 4 on GPUs of 60 to 160 GiB",
    _sgl("arg_groups/memory_hook.py", "reserve_for_graph_mb / handle_gpu_memory_settings"),
)
SGL_PREFILL_SIZES = Fact(
    "prefill graph sizes: 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256, "
    "4608.. step 512, up to max_bs = chunked_prefill_size (MLA: min(8192, chunked_prefill_size); PP > 1 with the "
    "breakable backend opted in: at most 8192)",
    _sgl("arg_groups/cuda_graph_hook.py", "generate_prefill_cuda_graph_batch_sizes"),
)
SGL_PREFILL_OFF = Fact(
    "prefill CUDA graphs are off by default (so they reserve nothing) under PP > 1 (apply_cuda_graph_compatibility: "
    "'PP prefill graph replay is opt-in') and for KDA hybrid linear attention (disable_breakable_cudagraph_if_"
    "incompatible); handle_cuda_graph_config runs before handle_gpu_memory_settings (arg_groups/pipeline.py)",
    _sgl(
        "arg_groups/cuda_graph_hook.py", "apply_cuda_graph_compatibility / disable_breakable_cudagraph_if_incompatible"
    ),
)
SGL_POST_CAPTURE = Fact(
    "post-capture KV sizing (which would skip the graph and activation reserve) is off unless "
    "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set",
    _sgl("arg_groups/overrides.py", "post_capture_kv_sizing_planned"),
)
SGL_POOL = Fact(
    "KV pool bytes = free memory after loading the weights - pre_model_load_memory x (1 - mem_fraction_static), "
    "where pre_model_load_memory is the free memory measured after parallel init and before loading (so: "
    "pre x mem_fraction_static - weights)",
    _sgl("mem_cache/kv_cache_configurator.py", "KVCacheConfigurator._profile_available_bytes"),
)
SGL_CELL = Fact(
    "tokens = pool bytes // cell, floored to the page size; cell per token = layers x (MLA: kv_lora_rank + "
    "qk_rope_head_dim, whole on every rank; else max(1, kv_heads // attn_tp_size) x (head_dim + v_head_dim)) x the "
    "KV dtype's bytes, over the full-attention layers of the rank's PP stage",
    _sgl("model_executor/pool_configurator.py", "DefaultPoolConfigurator._compute_cell_size / calculate_pool_sizes"),
)
SGL_SWA = Fact(
    "sliding-window hybrids: cell = full-layer bytes + swa_full_tokens_ratio (0.8) x SWA-layer bytes per token; the "
    "full pool holds that many tokens, the SWA pool 0.8 times as many",
    _sgl("model_executor/pool_configurator.py", "HybridSWAPoolConfigurator._recompute_cell_size / _solve_pool_sizes"),
)
SGL_MAMBA = Fact(
    "linear-attention hybrids: mamba_full_memory_ratio (0.9) / 1.9 of the pool goes to state slots, "
    "K = (budget - per_slot) // per_slot, K + 1 slots are subtracted, the rest is the full-attention KV pool; "
    "max_running_requests <= K // 3 (3 state slots per request with the radix cache on)",
    _sgl(
        "mem_cache/kv_cache_configurator.py", "_handle_max_mamba_cache / _calculate_mamba_ratio / resolve_max_num_reqs"
    ),
)
SGL_MAX_RUNNING = Fact(
    "--max-running-requests unset: min(clamp(tokens / context_len x 512, 2048, 4096), tokens // 2) per DP worker; "
    "given: min(it // attn_dp_size, tokens // 2)",
    _sgl("mem_cache/kv_cache_configurator.py", "KVCacheConfigurator.resolve_max_num_reqs"),
)
SGL_FACTS = (SGL_FRACTION, SGL_GRAPH, SGL_PREFILL_SIZES, SGL_PREFILL_OFF, SGL_POST_CAPTURE, SGL_POOL, SGL_CELL,
             SGL_SWA, SGL_MAMBA, SGL_MAX_RUNNING)  # fmt: skip

SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9
MAMBA_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, radix cache on


def sglang_decode_graph_max_bs(gpu_mib: float, mesh: Mesh) -> int:
    """Decode CUDA-graph max batch unset, by GPU memory (MiB) and the mesh's TP (`handle_gpu_memory_settings`)."""
    tp = mesh.tp
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 48 if tp < 4 else 160
    if gpu_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_prefill_graph_sizes(max_bs: int) -> list[int]:
    """The token counts prefill graphs are captured at (`generate_prefill_cuda_graph_batch_sizes`)."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512))
    )  # fmt: skip
    return [s for s in sizes if s <= max_bs]


@dataclass(frozen=True)
class SglangReserve:
    """SGLang's reserved_mem (MiB) and the mem_fraction_static it derives, with its parts."""

    gpu_mib: float
    chunked_prefill_size: int
    decode_max_bs: int
    activations_mib: float  # 512 + 1.5 x max(chunk, 2048)
    parallel_mib: float  # tp x pp / 8 x 1024
    graphs_mib: float
    floor_mib: float  # what the 10 GiB floor adds (0 when the sum is above it)
    mem_fraction_static: float

    @property
    def reserved_mib(self) -> float:
        return self.activations_mib + self.parallel_mib + self.graphs_mib + self.floor_mib


def sglang_reserve(gpu_mib: float, mesh: Mesh, *, mla: bool, attn_dp: int = 1, kda: bool = False) -> SglangReserve:
    """`handle_gpu_memory_settings` at the launch line's defaults (no --mem-fraction-static, chunked prefill,
    decode CUDA graphs on, prefill CUDA graphs as their defaults leave them (off under PP and for KDA hybrids,
    `SGL_PREFILL_OFF`), no DeepEP, not disaggregated); `attn_dp` > 1: DP attention; `kda`: KDA linear attention."""
    chunk = scheduler_rules("sglang@0.5.23").budget.default_tokens(gpu_mib / 1024)
    tp, pp = mesh.tp, mesh.pp  # SGLang's tp_size and pp_size
    max_bs = sglang_decode_graph_max_bs(gpu_mib, mesh)
    graphs = 2.0 * max_bs
    if attn_dp > 1:
        graphs += max_bs * attn_dp * 3 + (max_bs * attn_dp * 1.5 if max_bs > 300 else 0)
    if pp == 1 and not kda:  # prefill graphs on: 8 MiB per captured size, or MLA's 1.5 GiB
        prefill_max = min(8192, chunk) if mla else chunk
        graphs += 1.5 * 1024 if mla else 8.0 * len(sglang_prefill_graph_sizes(prefill_max))
    acts = 512 + max(chunk, 2048) * 1.5
    par = tp * pp / 8 * 1024
    total = acts + par + graphs
    floor = max(0.0, 10 * 1024 - total) if gpu_mib > 60 * 1024 else 0.0
    frac = round((gpu_mib - total - floor) / gpu_mib, 3)
    return SglangReserve(gpu_mib, chunk, max_bs, acts, par, graphs, floor, frac)


def sglang_mamba_split(rest_bytes: float, per_slot: float) -> tuple[int, float]:
    """(state slots K, bytes left for the full-attention KV pool) of a linear-attention hybrid
    (`_handle_max_mamba_cache`, the ratio-based branch, no speculative decoding)."""
    r = MAMBA_FULL_MEMORY_RATIO
    budget = rest_bytes * r / (1 + r)
    slots = int((budget - per_slot) // per_slot) if per_slot > 0 else 0
    return slots, rest_bytes - (slots + 1) * per_slot


def sglang_max_running(tokens: int, context_len: int | None, attn_dp: int = 1, given: int | None = None) -> int:
    """`resolve_max_num_reqs`: the running-request cap per DP worker; `context_len` None (tpplan does not know the
    model's context length): the estimate's lower clamp, 2048."""
    if given is not None:
        return min(max(1, given // attn_dp), tokens // 2)
    estimated = 2048 if context_len is None else max(min(int(tokens / context_len * 512), 4096), 2048)
    return min(estimated, tokens // 2)


# ---------------------------------------------------------------------------------------------
# vLLM 0.33.0 and 0.34.0


@dataclass(frozen=True)
class VllmMemory:
    """One vLLM version's KV sizing: its defaults and how the profiled numbers become the KV bytes."""

    version: str
    gpu_memory_utilization: float  # the default that applies on CUDA
    extensible: bool  # sized after warm-up from measured free memory (0.34.0's default on CUDA)
    block_size: int  # CacheConfig.DEFAULT_BLOCK_SIZE
    facts: tuple[Fact, ...]

    @property
    def key(self) -> str:
        return f"vllm@{self.version}"

    def max_num_seqs(self, gpu_gib: float, gpu_name: str = "") -> int:
        """max_num_seqs unset (OpenAI server): 1024 at 70 GiB and more except A100 and GB10, else 256."""
        small = any(s in gpu_name.lower() for s in ("a100", "gb10"))
        return 1024 if gpu_gib >= 160 or (gpu_gib >= 70 and not small) else 256

    def kv_bytes(self, card: float, weights: float, activation_peak: float, cuda_graphs: float = 0.0,
                 non_torch: float = 0.0) -> float:  # fmt: skip
        """Bytes the KV cache gets per rank from the card's bytes and the profiled figures."""
        if self.extensible:  # measure_kv_cache_bytes at utilization 1.0: headroom - margin - transient peak
            headroom = card - weights - cuda_graphs - non_torch
            margin = max(1.0 * GIB, 0.75 * activation_peak)
            return max(0.0, headroom - margin - activation_peak)
        requested = card * self.gpu_memory_utilization  # request_memory: ceil(total x utilization)
        return max(0.0, requested - (weights + non_torch + activation_peak) - cuda_graphs)

    def reserve_text(self) -> str:
        if self.extensible:
            return "the activation peak + max(1 GiB, 0.75 x the peak) (extensible KV cache, utilization 1.0)"
        util = self.gpu_memory_utilization
        return f"{1 - util:.0%} of the card (gpu_memory_utilization {util}) + the activation peak"


def _vllm_common(v: str) -> tuple[Fact, ...]:
    return (
        Fact(
            "num_blocks = available_memory // bytes_per_block, bytes_per_block = the largest KV-cache group's page "
            "bytes summed over its layers (block_size tokens x per-token bytes per layer); groups of a hybrid share "
            "the blocks",
            _vllm(v, "v1/core/kv_cache_planning.py", "get_kv_cache_config_from_groups / _get_kv_cache_bytes_per_block"),
        ),
        Fact(
            "KV heads per rank: 1 for MLA (the latent, whole on every rank), else max(1, kv_heads // tp)",
            _vllm(v, "config/model.py", "ModelConfig.get_num_kv_heads"),
        ),
        Fact(
            "a sliding-window layer holds at most cdiv(min(sliding_window - 1 + tokens in flight, max_model_len), "
            "block_size) + 1 blocks per request (the admission cap; tpplan takes one decode token in flight)",
            _vllm(v, "v1/kv_cache_interface.py", "SlidingWindowSpec.max_admission_blocks_per_request"),
        ),
        Fact(
            "max_num_seqs unset (OpenAI server): 1024 on GPUs of 70 GiB and more except A100 and GB10 (and at "
            "160 GiB and more), else 256",
            _vllm(v, "engine/arg_utils.py", "EngineArgs.get_batch_defaults"),
        ),
    )


VLLM_0_33_0_MEMORY = VllmMemory(
    "0.33.0", 0.92, False, 16,
    (
        Fact("gpu_memory_utilization defaults to 0.92; block_size to 16 (DEFAULT_BLOCK_SIZE)",
             _vllm("0.33.0", "config/cache.py", "CacheConfig")),
        Fact(
            "available KV memory = ceil(total x gpu_memory_utilization) - non_kv_cache_memory - the CUDA-graph "
            "estimate (utils/mem_utils.py memory_profiling: non_kv_cache_memory = memory consumed since start "
            "(weights, non-torch memory such as NCCL) + "
            "the profiled transient activation peak; CUDA-graph memory is estimated by a capture pass "
            "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1))",
            _vllm("0.33.0", "v1/worker/gpu_worker.py", "Worker.determine_available_memory"),
        ),
        *_vllm_common("0.33.0"),
    ),
)  # fmt: skip
VLLM_0_34_0_MEMORY = VllmMemory(
    "0.34.0", 1.0, True, 64,
    (
        Fact(
            "block_size defaults to 64 (DEFAULT_BLOCK_SIZE); gpu_memory_utilization unset resolves to 1.0 with the "
            "extensible KV cache (on by default on CUDA and ROCm) and 0.92 without",
            _vllm("0.34.0", "config/cache.py", "CacheConfig.resolved_gpu_memory_utilization"),
        ),
        Fact(
            "extensible KV cache bytes = min(requested - non-KV memory used, headroom - margin) - max(transient peak, "
            "torch reserve growth); headroom = free after warm-up and graph capture + the committed KV; margin = "
            "max(1 GiB, 0.75 x transient peak); at utilization 1.0 that is headroom - margin - peak",
            _vllm("0.34.0", "v1/worker/extensible_kv_cache.py", "measure_kv_cache_bytes / measure_kv_cache_blocks"),
        ),
        *_vllm_common("0.34.0"),
    ),
)  # fmt: skip

VLLM_MEMORY: dict[str, VllmMemory] = {m.key: m for m in (VLLM_0_33_0_MEMORY, VLLM_0_34_0_MEMORY)}
MEMORY_ENGINES = ("sglang@0.5.23", *VLLM_MEMORY)


def memory_facts(key: str) -> tuple[Fact, ...]:
    """The KV-sizing facts of engine version `key`; a TpplanError naming the versions read."""
    if key == "sglang@0.5.23":
        return SGL_FACTS
    if key in VLLM_MEMORY:
        return VLLM_MEMORY[key].facts
    raise TpplanError(
        f"engine={key}", "no KV-sizing facts read for that version", f"use one of {', '.join(MEMORY_ENGINES)}"
    )


# ---------------------------------------------------------------------------------------------
# The result: what `tpplan.cost.kv_capacity` computes per engine version

DIFFERENCES = (
    "the card's bytes are tpplan's GPU figure (memory_GiB), not what nvidia-smi or cudaMemGetInfo reports",
    "the CUDA context and NCCL communicator buffers the engine has taken before it measures free memory are not "
    "counted, and vLLM's CUDA-graph memory (measured by a capture pass) is taken as 0: the pool is an upper bound",
    "weights are tpplan's per-rank figure for the fullest PP stage's layers, in the stored dtype",
    "vLLM's activation peak is tpplan's estimate of one step of max_num_batched_tokens (stream tensors plus the "
    "largest op's live set), not a profiled peak",
    "recurrent state is tpplan's (delta-rule state in fp32 plus conv tails); the engine sizes it from the model "
    "config's state dtype",
    "vLLM's admission gate may charge a sliding-window request for window - 1 + every token in flight (chunked "
    "prefill), where tpplan counts a decode step's one",
    "SGLang floors tokens to its page size and vLLM's hybrid allocator pads KV-cache groups to one page size; "
    "neither is modelled (a few tokens, more for hybrids)",
    "only the launch line's defaults are sized: an explicit --mem-fraction-static, --gpu-memory-utilization, "
    "--max-running-requests or --max-num-seqs, speculative decoding (draft weights and KV), PD-disaggregated modes "
    "and DeepEP buffers are not modelled",
    "SGLang's running-request estimate needs the model's context length, which tpplan does not keep: the lower "
    "clamp, 2048, is used",
)


@dataclass(frozen=True)
class KVCapacity:
    """One engine version's KV cache on one deployment, per rank (the PP stage that admits the fewest)."""

    engine: str  # "sglang@0.5.23"
    card_bytes: float
    weights: float  # per rank, the stage that limits the pool
    reserve: float  # what the engine keeps off the KV pool besides weights (activations, graphs, slack)
    reserve_text: str
    pool_bytes: float  # KV (and state) pool per rank
    bytes_per_token: float  # full-attention KV bytes per token per rank (the engine's cell)
    tokens: int  # KV tokens per rank
    max_running: int  # the engine's running-request cap (--max-running-requests / max_num_seqs default)
    seq_len: int | None  # prompt + output of the workload's longest request
    batch: int | None  # the largest decode batch the pool admits at seq_len (an engine instance's)
    bound: str | None  # "KV pool", "max_running_requests", "max_num_seqs" or "state slots"
    settings: dict[str, float] = field(default_factory=dict)  # the memory settings the engine derives
    facts: tuple[str, ...] = ()  # citations of the formulas used

    @property
    def label(self) -> str:
        name, version = self.engine.split("@")
        return f"{'SGLang' if name == 'sglang' else 'vLLM'} {version}"

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "card_bytes": self.card_bytes,
            "weights_bytes_per_rank": self.weights,
            "reserve_bytes_per_rank": self.reserve,
            "reserve": self.reserve_text,
            "kv_pool_bytes_per_rank": self.pool_bytes,
            "kv_bytes_per_token_per_rank": self.bytes_per_token,
            "kv_tokens_per_rank": self.tokens,
            "max_running_requests": self.max_running,
            "seq_len": self.seq_len,
            "decode_batch": self.batch,
            "decode_batch_bound": self.bound,
            "settings": dict(self.settings),
            "sources": list(self.facts),
            "differences": list(DIFFERENCES),
        }


__all__ = [
    "DIFFERENCES",
    "MEMORY_ENGINES",
    "SGL_FACTS",
    "VLLM_MEMORY",
    "KVCapacity",
    "SglangReserve",
    "VllmMemory",
    "memory_facts",
    "sglang_decode_graph_max_bs",
    "sglang_mamba_split",
    "sglang_max_running",
    "sglang_prefill_graph_sizes",
    "sglang_reserve",
]
