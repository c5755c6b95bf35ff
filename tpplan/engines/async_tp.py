"""GEMM + collective fusion ("async TP") as the engines run it, read from their sources.

Under Megatron sequence parallelism every all-gather feeds a column-parallel GEMM and every
row-parallel GEMM feeds a reduce-scatter. Async TP runs each pair as one op that splits the GEMM
into TP chunks along the token rows and moves each chunk's rows by a peer-to-peer copy from (or to)
one peer while the previous chunk's GEMM runs: PyTorch's symmetric-memory ops
`torch.ops.symm_mem.fused_all_gather_matmul` and `fused_matmul_reduce_scatter`.

What the read releases do with it:

- SGLang 0.5.23: `--enable-layernorm-sp` (its `layernorm-sp` mode, `tpplan.engines.sglang`) calls the
  torch ops from the participant linears (qkv / gate_up: all-gather into the GEMM; o_proj / down:
  GEMM into the reduce-scatter) whenever the linear is eligible; there is no flag for SP without
  the fusion. Muse Spark takes CUTLASS kernels instead (not priced here).
- vLLM 0.34.0 (and 0.33.0): no async-TP or sequence-parallelism compile pass (`PassConfig` has neither field:
  `tpplan.engines.vllm.VLLM_NO_SP_PASS`); its one GEMM + reduce-scatter kernel (`VLLM_ENABLE_GEMM_RS=1`, Kimi-K3 and
  DeepSeek-V4.1 projections) is an SM100 CUTLASS kernel that H100/H200 never run (`VLLM_GEMM_RS`).

The pricer (`tpplan.cost.async_tp`) simulates torch's chunk pipeline; this module holds what the
engines and torch do, with their sources, for the audit, the prediction and the memo.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines import sglang, sglang_source, vllm
from tpplan.engines.schema import Gate, Mode, Source
from tpplan.mesh import Mesh

TORCH = "pytorch/pytorch"
TORCH_REF = "torch 2.13.0 (commit cf30153c)"
SYMM = "torch/distributed/_symmetric_memory/__init__.py"


def _torch(function: str) -> Source:
    return Source(TORCH, SYMM, function, TORCH_REF)


def _sgl(path: str, function: str) -> Source:
    return Source(sglang_source.REPO, f"python/sglang/srt/{path}", function, sglang_source.REL)


def _vllm(path: str, function: str) -> Source:
    return Source(vllm.REPO, f"vllm/{path}", function, vllm.REL)


# How torch decomposes the two ops (what `tpplan.cost.async_tp` simulates).
AG_PIPELINE = _torch("_pipelined_multi_all_gather_and_consume")
RS_PIPELINE = _torch("_pipelined_produce_and_all2all")
AG_OP = _torch("_fused_all_gather_matmul (-> _fused_all_gather_matmul_impl)")
RS_OP = _torch("_fused_matmul_reduce_scatter_impl")
PEERS = _torch("get_remote_tensors (works only within an NVLink domain), SymmetricMemory.get_buffer")

AG_DECOMPOSITION = (
    "each rank copies its T/N rows into its symmetric buffer (barrier), runs its own chunk's GEMM, then for "
    "step 1..N-1 copies peer (rank+step)'s rows out of that peer's buffer over NVLink and runs that chunk's "
    "GEMM; steps alternate between the current and a second stream, so chunk k+1's copy runs under chunk k's "
    "GEMM; last, its own rows are copied into the gathered output (return_A, which SGLang leaves on)"
)
RS_DECOMPOSITION = (
    "for step 1..N-1 each rank computes the partial GEMM of peer (rank+step)'s rows into one of two symmetric "
    "buffers, barriers, and copies the partial meant for it out of peer (rank-step)'s buffer; the two buffers "
    "alternate between two streams, so step k's copy runs under step k+1's GEMM; then it computes its own "
    "rows' partial and sums the N partials (torch.sum over the stacked chunks) into its T/N rows"
)
VOLUME = (
    "the same bytes per rank as NCCL's ring, (N-1)/N of the gathered tensor, moved as N-1 peer-to-peer copies "
    "(one per peer, pulled from its symmetric buffer) instead of N-1 ring steps; besides, HBM traffic NCCL "
    "does not have: the all-gather copies the rank's shard twice (into its buffer, into the gathered output), "
    "the reduce-scatter stacks N partial chunks and sums them in a separate kernel"
)

# What tpplan's runtime does with a fused plan (gloo and tpplan's NCCL calls have no symmetric memory).
VERIFY_NOTE = (
    "async TP changes how the collectives run, not what they compute or how many bytes they move: `verify` "
    "executes the un-fused plan (gloo has no symmetric memory), its all-gathers and reduce-scatters as collectives"
)


@dataclass(frozen=True)
class FusedGemmCollective:
    """One engine's GEMM + collective fusion: which flag turns it on, for which models, under which gates."""

    name: str  # the plan suffix: `<plan>+asynctp`
    engine: str  # "SGLang 0.5.23"
    flags: tuple[str, ...]  # what the launch line adds
    mode: Mode  # the sequence-parallel mode it runs inside (its gates apply too)
    model_types: tuple[str, ...]  # tpplan model types the engine runs it for
    ops: tuple[Source, ...]  # where the engine calls the fused ops
    gates: tuple[Gate, ...]  # the fusion's own gates (the mode's come first in `all_gates`)
    model_gate: Source  # where the engine decides which models run it
    priced: bool = True  # False: recorded, not what `+asynctp` prices
    otherwise: str = ""  # what the engine has for the other models

    @property
    def all_gates(self) -> tuple[Gate, ...]:
        return self.mode.gates + self.gates

    def not_run_for(self, model_type: str, mesh: Mesh | None = None, dp_attention: bool = False) -> str | None:
        """Why this engine does not run the fused plan on `mesh` here, with the source (None: it does)."""
        hook = self.model_gate
        if model_type not in self.model_types:
            return (f"{' '.join(self.flags)} runs it only for {', '.join(self.model_types)} ({hook.cite()})"
                    + (f"; {self.otherwise}" if self.otherwise else ""))  # fmt: skip
        if mesh is not None and mesh.pp > 1:
            return f"{self.engine} refuses {' '.join(self.flags)} with pipeline stages ({hook.cite()})"
        if dp_attention:
            return f"{self.engine} refuses {' '.join(self.flags)} under DP attention ({hook.cite()})"
        return None


SGLANG_ASYNC_TP = FusedGemmCollective(
    name="asynctp",
    engine="SGLang 0.5.23",
    flags=sglang.SGL_LAYERNORM_SP.flags,
    mode=sglang.SGL_LAYERNORM_SP,
    model_types=("qwen3",),  # Qwen3ForCausalLM; Muse Spark (not a tpplan model) takes CUTLASS kernels
    model_gate=sglang.LNSP_HOOK,
    ops=(
        _sgl("layers/layernorm_sp.py", "column_parallel_g_matmul -> torch.ops.symm_mem.fused_all_gather_matmul"),
        _sgl("layers/layernorm_sp.py", "row_parallel_gbar_matmul -> torch.ops.symm_mem.fused_matmul_reduce_scatter"),
    ),
    gates=(
        Gate(
            "the fused op runs only for an unquantized, bias-free bf16/fp16 linear, and only where torch has "
            "torch.ops.symm_mem.fused_matmul_reduce_scatter and fused_all_gather_matmul; otherwise NCCL's "
            "all-gather + GEMM / GEMM + reduce-scatter",
            "model",
            ("--quantization",),
            "falls back",
            _sgl("layers/layernorm_sp.py", "sp_fused_matmul_eligible (_HAS_TORCH_SYMM_MEM_FUSED)"),
        ),
        Gate(
            "every TP rank reads its peers' symmetric buffers directly: the TP group must share one NVLink "
            "domain (one node here); nothing in the Python falls back across nodes",
            "gpu",
            ("--tp-size",),
            "asserts",
            PEERS,
        ),
        Gate(
            "torch's native kernel (_async_input_mm) only with TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP and "
            "2048 < T <= 4096; the multimem all-gather only without return_A: SGLang's call takes the "
            "chunked decomposition",
            "env",
            ("TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP",),
            "per batch",
            _torch("_should_use_fused_all_gather_matmul_native, _should_use_multimem_all_gather_matmul"),
        ),
    ),
)

_GEMM_RS = "model_executor/kernels/linear/cute_dsl/gemm_rs_ar.py"
NO_VLLM_PASS = _vllm("compilation/passes/pass_manager.py", "PostGradPassManager.configure (no async-TP / SP pass)")
# Before the release, main had the pass (read at the index's commit): AsyncTPPass, on top of
# SequenceParallelismPass (`pass_config.enable_sp`, `fuse_gemm_comms`), replaced mm -> vllm.reduce_scatter
# by fused_matmul_reduce_scatter and vllm.all_gather -> mm by fused_all_gather_matmul (FP8 scaled-mm
# variants for bf16 models only); with piecewise splitting ops it applied only to compile sizes divisible by TP.
OLD_VLLM_PASS = Source(vllm.REPO, "vllm/compilation/collective_fusion.py", "AsyncTPPass (is_applicable)",
                       "commit 0248dcdf")  # fmt: skip
# registered as a custom op, called by nothing in the release (a remnant of the removed pass)
UNUSED_VLLM_OP = _vllm("distributed/parallel_state.py", "patched_fused_scaled_matmul_reduce_scatter")
VLLM_GEMM_RS = FusedGemmCollective(
    name="gemm-rs",
    engine=f"vLLM {vllm.VERSION}",
    flags=("VLLM_ENABLE_GEMM_RS=1",),
    mode=vllm.VLLM_MOE_SP,  # the RS mode binds only where K3 runs sequence-parallel (use_sequence_parallel)
    model_types=("kimi_k3",),  # and DeepSeek-V4.1's wo_b (not a tpplan model)
    model_gate=_vllm("models/kimi_k3/nvidia/model.py", "maybe_init_gemm_rs_ar"),
    otherwise=f"the release has no async-TP compile pass ({NO_VLLM_PASS.cite()})",
    ops=(
        _vllm("models/kimi_k3/nvidia/model.py", "maybe_init_gemm_rs_ar (use_sequence_parallel)"),
        _vllm(_GEMM_RS, "GemmRsAr.apply (Sm100GemmRsAr: tile flags, multimem ld_reduce epilogue)"),
    ),
    gates=(
        Gate(
            "SM100-family GPU (B200/GB200), BF16 model dtype, no micro-batching, TP 2-16 dividing 128, hidden "
            "a multiple of 128: else a warning and the unfused path",
            "gpu",
            ("VLLM_ENABLE_GEMM_RS",),
            "runs baseline",
            _vllm(_GEMM_RS, "maybe_init_gemm_rs_ar"),
        ),
        Gate(
            "NVLink multicast memory for the symmetric workspace (one NVLink domain): else a warning and the "
            "unfused path",
            "gpu",
            (),
            "runs baseline",
            _vllm(_GEMM_RS, "GemmRsAr.__init__ (multicast_ptr == 0 raises; caught in maybe_init_gemm_rs_ar)"),
        ),
        Gate("batches of at least 128 rows", "batch", (), "per batch", _vllm(_GEMM_RS, "GemmRsAr.should_run")),
    ),
    priced=False,  # a persistent CUTLASS kernel, not torch's chunk pipeline; no H200 runs it
)

# What `<plan>+asynctp` prices, and every record (for the docs and the memo).
ASYNC_TP = SGLANG_ASYNC_TP
FUSIONS: tuple[FusedGemmCollective, ...] = (SGLANG_ASYNC_TP, VLLM_GEMM_RS)


def launch_flags(
    model_type: str, mesh: Mesh | None = None, dp_attention: bool = False
) -> dict[str, tuple[str, ...] | str]:
    """Per engine: the flags that realise `<plan>+asynctp` for this model on `mesh` (None: one stage), or why
    none do (for the memo)."""
    out: dict[str, tuple[str, ...] | str] = {}
    for f in FUSIONS:
        why = f.not_run_for(model_type, mesh, dp_attention)
        if not f.priced and why is None:
            why = f"{' '.join(f.flags)} is an SM100 CUTLASS kernel, not torch's chunk pipeline ({f.ops[1].cite()})"
        out[f.engine] = f.flags if why is None else why
    return out


__all__ = [
    "AG_DECOMPOSITION",
    "ASYNC_TP",
    "FUSIONS",
    "RS_DECOMPOSITION",
    "SGLANG_ASYNC_TP",
    "VERIFY_NOTE",
    "VLLM_GEMM_RS",
    "VOLUME",
    "FusedGemmCollective",
    "launch_flags",
]
