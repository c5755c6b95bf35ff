"""Prefill context parallelism as the engines run it, read from their wheels (and the open PRs).

One `CpPath` per engine path: which layers see a token shard, how the rest of the sequence reaches
attention (what is gathered, over which group), how the FFN/MoE runs, what a rank keeps in its KV
cache, and the gates. `tpplan.layout.context_parallel` models two CP modes (`CpLayers`):
"all" (every layer on the rank's tokens, the rank's TP group of `tp` GPUs per CP rank) and "mla"
(SGLang PR #38344's full-sequence CP: only the MLA layers are token-sharded, inside the TP group);
each path says which tpplan mode is closest and what differs (`differences`).

Memory: both engines write the gathered K/V (or latent) into every CP rank's cache, so a rank's KV is
NOT 1/cp of the sequence's: `kv_cp_share` is what the predictor reads (the engines' way by default; tpplan's
own 1/cp only with `--cp-kv sharded`).
Planner-level: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpplan.engines import sglang_source, vllm
from tpplan.engines.schema import Gate, Source
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

KvPerRank = Literal["replicated", "sharded"]


def _sgl(path: str, function: str) -> Source:
    return Source(sglang_source.REPO, f"python/sglang/srt/{path}", function, sglang_source.REL)


def _vllm(path: str, function: str) -> Source:
    return Source(vllm.REPO, f"vllm/{path}", function, vllm.REL)


def _pr(number: int, what: str, date: str) -> Source:
    """An open pull request read through the search index's description (its code is not in the index)."""
    return Source(sglang_source.REPO, f"pull/{number}", what, f"PR #{number} description {date} (open; code not read)")


@dataclass(frozen=True)
class CpPath:
    """One engine's prefill-CP path for a class of models."""

    engine: str
    name: str
    flags: tuple[str, ...]
    models: str
    token_sharded: str  # which layers see only the rank's tokens
    split: str
    exchange: str  # what attention gathers and over which group
    ffn: str  # how the MLP/MoE runs under CP
    kv_per_rank: KvPerRank
    kv_source: Source
    gates: tuple[Gate, ...]
    sources: tuple[Source, ...]
    tpplan_mode: str | None  # the closest `--cp-layers` mode (None: tpplan has none)
    differences: tuple[str, ...] = ()
    in_release: bool = True  # False: an open PR, not in the wheel


SGLANG_ZIGZAG = CpPath(
    engine="SGLang 0.5.23",
    name="prefill CP, zigzag (MLA / DSA / GQA attention)",
    flags=("--enable-prefill-cp", "--attn-cp-size C", "--cp-strategy zigzag"),
    models="models with an MLA, DSA or GQA attention backend that reach the CP strategy (see the gates)",
    token_sharded="the residual stream and attention: every layer's attention runs on the rank's zigzag rows",
    split="2C blocks per sequence (the first len % 2C one token longer); rank r holds blocks r and 2C-1-r",
    exchange=(
        "all-gather over the attention-CP group of the rank's K and V (GQA, K beside V) or of the MLA latent "
        "(kv_lora + rope), padded to the longest rank, then reordered to token order; attention runs twice "
        "(the early block, the late block) against the gathered keys"
    ),
    ffn=(
        "MLA/DSA CP: the FFN input is all-gathered over attention CP and its output reduce-scattered back "
        "there (the MoE runs the whole sequence over the TP group, tp_size = attn_tp x attn_cp); GQA CP "
        "gathers over the MoE-CP group"
    ),
    kv_per_rank="replicated",
    kv_source=_sgl("layers/cp/zigzag.py", "ZigzagCPStrategy.materialize_full_kv / materialize_full_mla_kv"),
    gates=(
        Gate(
            "every extend sequence has at least 2 x attn_cp_size tokens, and the batch is a CP extend",
            "batch",
            ("--attn-cp-size",),
            "per batch",
            _sgl("layers/cp/zigzag.py", "ZigzagCPStrategy.can_apply"),
        ),
        Gate(
            "attention backend fa3 / fa4 / flashinfer or trtllm_mha",
            "server arg",
            ("--attention-backend",),
            "asserts",
            _sgl("layers/cp/zigzag.py", "ZigzagCPStrategy.get_supported_attention_backend"),
        ),
        Gate(
            "tp_size divisible by attn_dp_size x attn_cp_size (attention TP = tp / (dp x cp))",
            "server arg",
            ("--tp-size", "--attn-cp-size"),
            "refuses",
            _sgl("arg_groups/parallel_hook.py", "handle_context_parallelism"),
        ),
        Gate(
            "--cp-strategy must be set with --enable-prefill-cp",
            "server arg",
            ("--cp-strategy",),
            "refuses",
            _sgl("arg_groups/parallel_hook.py", "handle_context_parallelism"),
        ),
        Gate(
            "Nemotron-H refuses attn_cp_size > 1; LongCat-Flash refuses prefill CP; DeepSeek-V3.2 refuses zigzag "
            "(interleave only); MiMo-V2 zigzag only; HIP: DeepSeek-V4 only",
            "model",
            ("--cp-strategy",),
            "refuses",
            _sgl("arg_groups/parallel_hook.py", "_boundary_parallelism_overrides, handle_context_parallelism"),
        ),
        Gate(
            "--dcp-size > 1 refuses --enable-prefill-cp",
            "server arg",
            ("--dcp-size",),
            "refuses",
            _sgl("arg_groups/parallel_hook.py", "handle_decode_context_parallelism"),
        ),
    ),
    sources=(
        _sgl("layers/cp/zigzag.py", "ZigzagCPStrategy.build_metadata, _all_gather_reorganized, run_attention"),
        _sgl("layers/layer_boundary/layout.py", "_cp_gathers_over_attn_cp, moe_gathers_over_moe_cp"),
        _sgl("layers/utils/cp_utils.py", "(an import-only shim in 0.5.23: the legacy CP helpers were removed)"),
    ),
    tpplan_mode="all",
    differences=(
        "tpplan's `all` runs each CP rank's MLP/MoE on its own tokens at TP `tp` (weights replicated over the "
        "CP ranks); SGLang gathers the FFN input over CP and runs it over tp x cp ranks: not modelled",
        "KV per rank: tpplan with --engine sglang keeps the whole sequence's KV on every CP rank, as SGLang does",
    ),
)

SGLANG_GROUP_SHARING = CpPath(
    engine="SGLang 0.5.23",
    name="CP-TP group sharing (hybrid linear-attention models)",
    flags=("--enable-prefill-cp", "--attn-cp-size = --tp-size", "--cp-strategy zigzag|interleave"),
    models="Glm5NextForConditionalGeneration (interleave), Qwen4ExpForConditionalGeneration (zigzag) only",
    token_sharded="the residual stream, the softmax attention and the indexer",
    split="zigzag (Qwen4Exp) or interleave (GLM-5-Next, token i on rank i mod C)",
    exchange="softmax attention as the zigzag/interleave strategy; linear attention gathers the sequence",
    ffn="MoE and linear attention keep their TP partition over the whole TP group (= the CP group)",
    kv_per_rank="replicated",
    kv_source=_sgl("layers/cp/zigzag.py", "ZigzagCPStrategy.materialize_full_kv"),
    gates=(
        Gate(
            "attn_cp_size == tp_size; linear heads divisible by tp_size; no DCP, mixed chunk or moe-dp",
            "server arg",
            ("--attn-cp-size", "--tp-size"),
            "refuses",
            _sgl("arg_groups/cp_tp_group_sharing_hook.py", "resolve_cp_tp_group_sharing"),
        ),
        Gate(
            "the architecture is in _SUPPORTED_MODELS (Kimi-K3, Kimi-Linear, Qwen3-Next are not)",
            "model",
            (),
            "runs baseline",
            _sgl("arg_groups/cp_tp_group_sharing_hook.py", "_SUPPORTED_MODELS"),
        ),
    ),
    sources=(_sgl("arg_groups/fields/parallel.py", "enable_cp_tp_group_sharing (help text)"),),
    tpplan_mode=None,
    differences=("no tpplan family is one of its two architectures",),
)

SGLANG_K3_FULL_SEQUENCE = CpPath(
    engine="SGLang PR #38344 (open)",
    name="Kimi-K3 full-sequence CP: only the MLA layers token-sharded",
    flags=("--tp-size T", "--attn-cp-size C", "--enable-prefill-cp", "--cp-strategy zigzag"),
    models="KimiK3ForConditionalGeneration",
    token_sharded="the MLA layers' attention only (zigzag), at attention TP width A = T / C",
    split="zigzag, balanced causal work",
    exchange=(
        "none into attention (every rank holds the full sequence's hidden, so it expands K/V of every key "
        "itself: the K/V expansion is replicated C times); the attention output rows are gathered back over "
        "the CP group (tpplan: an all-gather of o_proj's output, after an all-reduce over A ranks when A > 1)"
    ),
    ffn="KDA and MoE layers run the full sequence on every rank with the usual TP-T collectives",
    kv_per_rank="replicated",
    kv_source=_pr(
        38344, "Motivation (inferred: every rank holds the full sequence, so its latent cache)", "2026-09-07"
    ),
    gates=(),
    sources=(
        _pr(38344, "Motivation: full-sequence CP, A = tp / cp, CP8 removes the MLA o_proj all-reduce", "2026-09-07"),
    ),
    tpplan_mode="mla",
    differences=(
        "the PR's code is not in the search index: the output gather (all-gather of o_proj's rows) is tpplan's "
        "reading of 'the MLA o_proj all-reduce disappears' with KDA/MoE on the full sequence",
    ),
    in_release=False,
)

SGLANG_KDA_CONTIGUOUS = CpPath(
    engine="SGLang PR #34059 (open)",
    name="KDA hybrids, contiguous strategy with the two-pass scan",
    flags=("--enable-prefill-cp", "--attn-cp-size C", "--cp-strategy contiguous"),
    models="Kimi-Linear / Kimi-K3 family (KDA hybrids)",
    token_sharded="every layer: one contiguous block per rank",
    split="contiguous (ContiguousCPStrategy), the layout linear layers need",
    exchange=(
        "KDA: FLA KCP's two-pass scan: one all-gather of each rank's chunk state transform per layer, "
        "independent of length (~4 MiB fp32 per rank at H=32, K=V=128, /TP) plus a conv halo; MLA: the latent "
        "all-gather, dispatched to MHA one-shot instead of absorbed MLA"
    ),
    ffn="not stated in the description read",
    kv_per_rank="replicated",
    # The code index holds the PR's contiguous.py at a commit of sgl-project/sglang (whether it is the PR's head
    # the index does not say); ZigzagCPStrategy's materialize_full_kv / materialize_full_mla_kv are read in 0.5.23.
    kv_source=Source(
        sglang_source.REPO,
        "python/sglang/srt/layers/cp/contiguous.py",
        "ContiguousCPStrategy (extends ZigzagCPStrategy, redefining only the layout metadata and the attention "
        "dispatch: dense/MLA layers keep the all-gather-KV path, materialize_full_kv writing the gathered KV into "
        "every rank's pool)",
        "commit 0ec8ad3d",
    ),
    gates=(
        Gate(
            "attn_cp divides tp (any attn_tp x cp)",
            "server arg",
            ("--attn-cp-size",),
            "refuses",
            _pr(34059, "Serving integration", "2026-08-08"),
        ),
    ),
    sources=(_pr(34059, "description: KDA state hand-off, ContiguousCPStrategy, attn_tp x cp", "2026-08-08"),),
    tpplan_mode="all",
    differences=(),  # KV per rank: read (kv_source), replicated as tpplan prices it
    in_release=False,
)

VLLM_PCP = CpPath(
    engine=f"vLLM {vllm.VERSION}",
    name="prefill context parallel (PCP)",
    flags=("--prefill-context-parallel-size C",),
    models="MLA models only (the MRV2 PCP manager refuses others)",
    token_sharded="every layer's attention: the rank's DualChunkSwap rows; decodes replicated or owner-sharded",
    split="2C chunks of ceil(len / 2C) per prefill (the last ones shorter); rank r holds chunks r and 2C-1-r",
    exchange=(
        "the MLA latent (kv_c_normed + k_pe) all-gathered over the PCP group before the cache write; attention "
        "at TP `tp` inside the PCP rank"
    ),
    ffn=(
        "the MoE is sharded over TP x PCP (x DP); without EP the MoE runner all-gathers the PCP tokens to route; "
        "with EP it uses the all-to-all kernels"
    ),
    kv_per_rank="replicated",
    kv_source=_vllm("v1/attention/ops/pcp.py", "_gather_prefill_cache_inputs (every PCP rank keeps a replica)"),
    gates=(
        Gate(
            "MLA models only; no encoder-decoder, multimodal inputs or LoRA",
            "model",
            (),
            "refuses",
            _vllm("v1/worker/gpu/pcp_manager.py", "PCPManager.validate_config"),
        ),
        Gate(
            "PCP + DCP: sparse MLA only, dcp_comm_backend ag_rs, DCP in {1, PCP, TP x PCP}",
            "server arg",
            ("--decode-context-parallel-size",),
            "refuses",
            _vllm("config/parallel.py", "ParallelConfig (post-init checks)"),
        ),
        Gate(
            "a prefill is split only while it fills the 2 x PCP chunks: with DCP > 1 a shorter one is replicated on "
            "every rank; decodes are replicated (owner-sharded without DCP)",
            "batch",
            ("--prefill-context-parallel-size",),
            "per batch",
            _vllm("v1/worker/gpu/pcp_manager.py", "PCPManager.replicated_requests, _iter_rank_chunks"),
        ),
        Gate(
            "full CUDA graphs only for decode-only routines",
            "server arg",
            ("-cc.cudagraph_mode",),
            "refuses",
            _vllm("v1/worker/gpu/pcp_manager.py", "PCPManager.validate_config"),
        ),
    ),
    sources=(
        _vllm("config/parallel.py", "ParallelConfig.prefill_context_parallel_size (PCP expands the world size)"),
        _vllm("v1/worker/gpu/pcp_manager.py", "PCPManager._iter_rank_chunks, maybe_build_pcp_manager"),
        _vllm("model_executor/layers/fused_moe/config.py", "FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp"),
    ),
    tpplan_mode="all",
    differences=(
        "tpplan's `all` runs the MoE on the rank's own tokens at TP `tp`; vLLM shards it over TP x PCP on "
        "gathered tokens (or all-to-all with EP): not modelled",
        "vLLM's chunks are ceil(len / 2C) long; tpplan's (and SGLang's) are near-equal",
    ),
)

VLLM_DCP = CpPath(
    engine=f"vLLM {vllm.VERSION}",
    name="decode context parallel (DCP): not a prefill split",
    flags=("--decode-context-parallel-size D",),
    models="MLA and GQA backends that support DCP",
    token_sharded="none in prefill: DCP shards the decode KV cache (interleaved) across D ranks",
    split="KV interleaved by cp_kv_cache_interleave_size",
    exchange="decode: query all-gather and output/LSE combine (ag_rs or a2a)",
    ffn="unchanged",
    kv_per_rank="sharded",
    kv_source=_vllm("config/parallel.py", "ParallelConfig.decode_context_parallel_size"),
    gates=(
        Gate(
            "without PCP, tp_size divisible by dcp_size (DCP reuses the TP ranks)",
            "server arg",
            ("--decode-context-parallel-size",),
            "refuses",
            _vllm("config/parallel.py", "ParallelConfig (post-init checks)"),
        ),
    ),
    sources=(_vllm("config/parallel.py", "ParallelConfig.decode_context_parallel_size"),),
    tpplan_mode=None,
    differences=("decode is not priced by tpplan",),
)

CP_PATHS: tuple[CpPath, ...] = (SGLANG_ZIGZAG, SGLANG_GROUP_SHARING, SGLANG_K3_FULL_SEQUENCE, SGLANG_KDA_CONTIGUOUS,
                                VLLM_PCP, VLLM_DCP)  # fmt: skip


CP_KV_MODES = {
    "engines": "every CP rank keeps the whole sequence's KV, as SGLang and vLLM do (both write the gathered "
    f"K/V into every CP rank's cache: {SGLANG_ZIGZAG.kv_source.cite()}; {VLLM_PCP.kv_source.cite()})",
    "sharded": "each CP rank keeps only its own tokens' KV (1/CP): tpplan's own accounting, an engine that "
    "shards its cache by sequence, which neither SGLang nor vLLM does",
}


def kv_cp_share(mesh: Mesh) -> int:
    """What a CP rank's KV cache is divided by on `mesh`: 1 in the engines' mode (the default,
    `CP_KV_MODES["engines"]`), its CP in tpplan's own `sharded` mode (asked for with `--cp-kv sharded`) where
    every layer's tokens are split (`--cp-layers all`; under `mla` no layer's tokens are, so 1)."""
    if mesh.cp_kv not in CP_KV_MODES:
        raise TpplanError(f"cp_kv={mesh.cp_kv}", "unknown KV mode under CP", f"use one of {', '.join(CP_KV_MODES)}")
    return mesh.cp if mesh.cp_kv == "sharded" and mesh.cp_layers == "all" else 1


__all__ = ["CP_KV_MODES", "CP_PATHS", "CpPath", "kv_cp_share"]
