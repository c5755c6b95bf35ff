"""How SGLang and vLLM size their KV cache: the formulas, as small pure functions read from their source.

Each release states its own KV sizing in its module of `tpplan/engines/releases/` (`EngineVersion.memory`,
read by `tpplan.engines.kv_sizing(key)`): SGLang's facts and ratios (`SglangMemory`), vLLM's defaults and
whether its cache is profiled or extensible (`VllmMemory`, whose `kv_bytes` is the formula). SGLang 0.5.23
derives `mem_fraction_static` from the GPU's memory, the chunked-prefill size, TP x PP and its CUDA-graph
settings before it starts (`handle_gpu_memory_settings`), measures free memory before loading the weights
and gives the KV pool what is free after loading less the non-static share of that measure
(`_profile_available_bytes`), and divides it by a per-token cell (`_compute_cell_size`): the `sglang_*`
functions below. vLLM 0.33.0 takes `gpu_memory_utilization` (0.92) of the card less the weights, the
activation peak, non-torch memory and CUDA-graph memory; 0.34.0 sizes an extensible KV cache from what is
free after warm-up and graph capture, less a margin and the activation peak, except on a P/D server whose
connector needs an IMEX channel the cluster lacks (`VllmMemory.for_server`: then 0.33.0's way at 0.92).

The formulas take numbers (MiB, bytes, tokens); `tpplan.cost.kv_capacity` feeds them the cost model's
per-rank weights, activations, KV bytes per token and recurrent state. Planner-level: no torch, no cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpplan.engines.schema import SglangMemory
from tpplan.mesh import Mesh

MIB = 2**20


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


def sglang_reserve(
    gpu_mib: float, mesh: Mesh, *, chunk: int, mla: bool, dp_attention: bool = False, kda: bool = False
) -> SglangReserve:
    """`handle_gpu_memory_settings` at the launch line's defaults (no --mem-fraction-static, chunked prefill of
    `chunk` tokens (the release's default budget for the GPU), decode CUDA graphs on, prefill CUDA graphs as
    their defaults leave them (off under PP and for KDA hybrids, `SGL_PREFILL_OFF`), no DeepEP, not
    disaggregated); `dp_attention`: DP attention over the mesh's TP ranks; `kda`: KDA linear attention."""
    tp, pp = mesh.tp, mesh.pp  # SGLang's tp_size and pp_size
    attn_dp = tp if dp_attention else 1  # SGLang's dp_size under --enable-dp-attention
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


def sglang_mamba_split(memory: SglangMemory, rest_bytes: float, per_slot: float) -> tuple[int, float]:
    """(state slots K, bytes left for the full-attention KV pool) of a linear-attention hybrid
    (`_handle_max_mamba_cache`, the ratio-based branch, no speculative decoding)."""
    r = memory.mamba_full_memory_ratio
    budget = rest_bytes * r / (1 + r)
    slots = int((budget - per_slot) // per_slot) if per_slot > 0 else 0
    return slots, rest_bytes - (slots + 1) * per_slot


def sglang_max_running(
    tokens: int, context_len: int | None, mesh: Mesh, *, dp_attention: bool = False, given: int | None = None
) -> int:
    """`resolve_max_num_reqs`: the running-request cap per DP worker (`dp_attention`: one worker per TP rank of
    `mesh`); `context_len` None (tpplan does not know the model's context length): the estimate's lower clamp,
    2048."""
    if given is not None:
        return min(max(1, given // (mesh.tp if dp_attention else 1)), tokens // 2)
    estimated = 2048 if context_len is None else max(min(int(tokens / context_len * 512), 4096), 2048)
    return min(estimated, tokens // 2)


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
    "MIB",
    "KVCapacity",
    "SglangReserve",
    "sglang_decode_graph_max_bs",
    "sglang_mamba_split",
    "sglang_max_running",
    "sglang_prefill_graph_sizes",
    "sglang_reserve",
]
