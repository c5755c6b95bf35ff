"""SGLang's SP-MoE as read in 0.5.23: `--moe-a2a-backend deepep|megamoe` beside attention TP. The MoE
runs on each rank's own rows with DeepEP dispatch/combine and attention TP reduce-scatters o_proj;
per model class its per-layer dataflow (Kimi-K3's default path and its `SGLANG_K3_SP_ATTN_RES`
norm-on-shard variant, DeepSeek-V3, Qwen3-MoE and Kimi-Linear), its gates, and the tuning tables
that decide where K3's fused SP collectives fall back to NCCL. `tpplan.engines.sglang` puts this
mode into the engine versions."""

from __future__ import annotations

from dataclasses import replace

from tpplan.engines.schema import Comm, Gate, Mode, NotWired, Op, Source, Wiring
from tpplan.engines.sglang_source import LB, REL, REPO
from tpplan.engines.sglang_source import rel as _rel

K3 = "python/sglang/srt/models/kimi_k3.py"

# The K3 SP collectives' tuning tables in the 0.5.23 wheel (python/sglang/kernels/ops/communication/configs/
# sp_collective/world={tp},H=7168,device_name={torch.cuda.get_device_name with spaces as _}.json), read one
# by one: (device, attention-TP size) -> the first token bucket whose reduce-scatter picks "nccl" (None:
# every bucket picks a fused strategy). The bucket used is the largest at or below the batch's tokens.
K3_SP_TABLES: dict[tuple[str, int], int | None] = {
    ("NVIDIA GB300", 4): 9364,  # 9364 and 16384: nccl (the per-rank shard exceeds the 32 MiB slot)
    ("NVIDIA GB300", 8): 8192,  # 8192 and 16384: nccl ("NCCL won standalone collectives at T=8192 and T=16384")
    ("NVIDIA GB300", 16): None,  # push to 256, pull from 512 through 16384
    ("NVIDIA GB200", 16): None,  # push to 256, pull from 512 through 16384
}
K3_SP_TABLE_LIST = ", ".join(f"{d.removeprefix('NVIDIA ')} TP{tp}" for d, tp in K3_SP_TABLES)
K3_SP_NCCL_LIST = "; ".join(
    f"{d.removeprefix('NVIDIA ')} TP{tp} from {n} tokens" for (d, tp), n in K3_SP_TABLES.items() if n is not None
)
K3_SP_TABLE_SOURCE = Source(
    REPO,
    "python/sglang/kernels/ops/communication/sp_collective.py + configs/sp_collective/*.json",
    "_table / get_dispatch (called by k3_sp_collective._init_state with num_tokens 1)",
    REL,
)
K3_SP_BUCKET_SOURCE = Source(
    REPO,
    "python/sglang/kernels/ops/communication/sp_collective.py + configs/sp_collective/*.json",
    "get_dispatch (nearest bucket at or below the tokens; strategy 'nccl' returns None)",
    REL,
)


K3SP = "python/sglang/srt/layers/communication/k3_sp_collective.py"
BANK = f"{LB}/residual/attn_bank.py"
FACTORIES = f"{LB}/factories.py"
BOUNDARY = f"{LB}/boundary.py"
A2A_ROWS = _rel("python/sglang/srt/layers/moe/utils.py", "is_moe_input_scattered_across_dp_ranks (any a2a backend)")
FFN_ROWS = _rel(FACTORIES, "_resolve_ffn (on_rank_rows: the sparse FFN on the rank's rows)")
EXIT_AG = _rel(BOUNDARY, "_select_exit_move -> ops.update_attn_tp_gather_output")
SLICE_RS = _rel(BOUNDARY, "_select_entry_step (sliced) -> _attn_tp_reduce_scatter_update_read")
GATHER_AFTER_READ = _rel(BOUNDARY, "_select_entry_step (gathered ATTN_TP) -> _update_read, then attn_tp_gather_input")
K3_READ_AFTER_GATHER = _rel(BANK, "_AttnReadout.reads_after_attn_tp_gather (not reads_slices) / _bank_rows")
K3_DISPATCH = _rel(K3, "KimiK3MoE (routed_expert_down_proj replicated; shared experts replicated under EP a2a)")
# Read in SGLang's 0.5.23 wheel; the code index holds the same logic at kimi_k3.py commit 0000e9b4 and
# layer_boundary/residual/attn_bank.py commit 0b306229 (`_AttnReadout.reads_after_attn_tp_gather`).
K3_SP_DEFAULT = (
    Comm(
        "AG",
        "the previous MoE layer's output added to the residual on the rank's rows (the latent MoE's tail add "
        "writes the stream), all-gathered to every row at that FFN's exit",
        "hidden",
        EXIT_AG,
    ),
    Op("attention-residual aggregation (every row of the bank, which every rank writes) + input_layernorm", "T"),
    Op("attention (head-parallel), o_proj", "T"),
    Comm(
        "RS",
        "o_proj partial sum onto the rank's T/N rows, with the residual's rows added "
        "(k3_sp_collective.reduce_scatter_res when the fused collectives are on, else NCCL)",
        "hidden",
        _rel(K3, "_k3_reduce_scatter_add / KimiK3DecoderLayer._ffn_input_fusions"),
    ),
    Op("post-attention aggregation (the rank's rows of the bank) and norm", "T/N"),
    Op("router, latent down projection, shared experts (replicated)", "T/N"),
    Comm("A2A", "DeepEP dispatch/combine of the MoE latent", "moe_latent", K3_DISPATCH),
    Op("latent up projection, + shared output + residual (the next stream)", "T/N"),
)
K3_SP_ATTN_RES = (
    Op("attention-residual aggregation + input_layernorm on the rank's bank slice", "T/N"),
    Comm("AG", "the normed attention input", "hidden", _rel(K3, "_carries_bank_slices")),
    Op("attention (head-parallel), o_proj", "T"),
    Comm(
        "RS",
        "o_proj partial sum onto the rank's T/N rows",
        "hidden",
        _rel(K3, "_k3_reduce_scatter_add (k3_sp_collective.reduce_scatter_res)"),
    ),
    Op("post-attention aggregation and norm, router, latent projections, shared experts", "T/N"),
    Comm("A2A", "DeepEP dispatch/combine of the MoE latent", "moe_latent", _rel(K3, "KimiK3DecoderLayer")),
)
# DeepSeek-V3 under any a2a backend: the generic stage boundaries (DeepseekV2DecoderLayer.stage_facts:
# declare_attn() / declare_ffn(sparse=...)); the norm reads on the rank's rows before the gather
# (NormReadout.reads_after_attn_tp_gather is False, residual/add_norm.py).
DSV3_A2A = (
    Op("input_layernorm (fused add of the previous MoE output, residual on the rank's rows)", "T/N"),
    Comm("AG", "the normed attention input", "hidden", GATHER_AFTER_READ),
    Op("MLA attention (fused_qkv_a_proj_with_mqa on every row), o_proj", "T"),
    Comm("RS", "o_proj partial sum onto the rank's rows, with the residual sliced", "hidden", SLICE_RS),
    Op("post_attention_layernorm, gate (router), shared experts", "T/N"),
    Comm("A2A", "DeepEP dispatch/combine from the rank's own rows", "moe_input", FFN_ROWS),
)

SGL_SP_MOE = Mode(
    name="sp-moe",
    flags=("--moe-a2a-backend deepep", "--deepep-mode auto"),  # decode: low latency (engines/deepep.py)
    summary="MoE on the rank's own rows with DeepEP dispatch/combine; attention TP reduce-scatters o_proj",
    wiring=(
        Wiring(
            model_types=("kimi_k3",),
            architectures=("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"),
            layers="MoE layers (dense layers keep the all-reduce path), SGLANG_K3_SP_ATTN_RES unset or the fused "
            "SP collectives off: the attention-residual bank on every row",
            dataflow=K3_SP_DEFAULT,
            plan="sglang-sp-moe",
            source=_rel(K3, "_shards_moe_rows / _stage_facts / KimiK3DecoderLayer.forward"),
            differences=(
                "the last MoE layer's exit all-gathers the stream before the output aggregation and final norm "
                "on every row; tpplan runs them on the rank's rows",
            ),
        ),
        Wiring(
            model_types=("kimi_k3",),
            architectures=("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"),
            layers="MoE layers, with SGLANG_K3_SP_ATTN_RES=1 and the fused SP collectives on",
            dataflow=K3_SP_ATTN_RES,
            plan="sp-moe",
            source=_rel(K3, "_carries_bank_slices"),
            differences=(
                "dense layers (before the first MoE layer) keep the all-reduce path in SGLang; tpplan's "
                "`sp-moe` reduce-scatters them too",
            ),
        ),
        Wiring(
            model_types=("deepseek_v3", "deepseek_v2", "kimi_k2"),
            architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
            layers="MoE layers after the first (each entered on the rank's rows)",
            dataflow=DSV3_A2A,
            plan="sp-moe",
            source=_rel("python/sglang/srt/models/deepseek_v2.py", "DeepseekV2DecoderLayer.stage_facts"),
            differences=(
                "dense layers (first_k_dense_replace) and the first MoE layer's entry all-reduce in SGLang (the "
                "dense FFN runs on every row); tpplan's `sp-moe` reduce-scatters and all-gathers them",
                "the last MoE layer's exit all-gathers the stream before the final norm (every row); tpplan "
                "norms the rank's rows",
            ),
        ),
        Wiring(
            model_types=("qwen3_moe", "kimi_linear"),
            architectures=("Qwen3MoeForCausalLM", "KimiLinearForCausalLM"),
            layers="MoE layers entered on the rank's rows (the same stage boundaries: declare_attn() and "
            "declare_ffn(sparse=...) in Qwen3MoeDecoderLayer.stage_facts and KimiDecoderLayer.stage_facts)",
            dataflow=tuple(
                replace(s, name="input_layernorm (fused add, residual on the rank's rows)")
                if isinstance(s, Op) and s.name.startswith("input_layernorm")
                else replace(s, name="attention, o_proj")
                if isinstance(s, Op) and s.name.startswith("MLA")
                else replace(s, name="post_attention_layernorm, gate, shared experts")
                if isinstance(s, Op)
                else s
                for s in DSV3_A2A
            ),
            plan="sp-moe",
            source=_rel("python/sglang/srt/models/qwen3_moe.py", "Qwen3MoeDecoderLayer.stage_facts"),
            differences=(
                "dense layers (Kimi-Linear's first_k_dense_replace) all-reduce in SGLang; tpplan's `sp-moe` "
                "reduce-scatters and all-gathers them",
                "the last MoE layer's exit all-gathers the stream before the final norm (every row); tpplan "
                "norms the rank's rows",
            ),
        ),
    ),
    not_wired=(
        NotWired(
            ("qwen3", "llama", "mistral", "qwen2"),
            "baseline",
            "a dense FFN keeps the attention's rows (_ffn_on_rank_rows moves only a sparse FFN onto the rank's "
            "rows under an a2a backend), so a dense model runs the all-reduce path",
            _rel(FACTORIES, "_ffn_on_rank_rows"),
        ),
    ),
    gates=(
        Gate(
            "the model has routed experts (a dense model starts all the same: no expert placement is built, "
            "eplb/expert_location.py, and its dense FFN keeps the attention's rows, the all-reduce path)",
            "model",
            (),
            "runs baseline",
            _rel(FACTORIES, "_ffn_on_rank_rows (sparse False)"),
            "has_moe",
        ),
        Gate(
            "ep_size is set to tp_size by the a2a backend (all experts over all TP ranks): a post-process after "
            "parsing (prepare_server_args still returns the --ep-size given, default 1)",
            "server arg",
            ("--moe-a2a-backend", "--ep-size"),
            "adjusts",
            _rel("python/sglang/srt/arg_groups/overrides.py", "_a2a_ep_size (run by moe_hook)"),
        ),
        Gate(
            "the routed experts divide over the EP ranks (tp_size under the a2a backend), asserted while the model "
            "loads",
            "model",
            ("--tp-size",),
            "refuses",
            _rel(
                "python/sglang/srt/layers/moe/fused_moe_triton/layer.py",
                "FusedMoE.__init__ (_num_global_routed % storage_ep_size; eplb/expert_location.py "
                "ExpertLocationMetadata._init_common asserts the physical count, with --ep-num-redundant-experts)",
            ),
            "experts_divide_tp",
        ),
        Gate(
            "shared experts replicated on every rank (no --shared-experts-tp-size, no shared-experts attention TP): "
            "otherwise K3 gathers their input and reduce-scatters their output inside the TP subgroup, which "
            "tpplan's SP-MoE plans do not model",
            "server arg",
            ("--shared-experts-tp-size", "--enable-shared-experts-attn-tp"),
            "adjusts",
            _rel(K3, "KimiK3MoE.__init__ (_shared_experts_tp1 / _forward_shared_experts)"),
        ),
        Gate(
            "batches padded to a multiple of attention TP (the default): with --disable-attn-tp-gather and no DP "
            "attention a batch whose rows do not divide stays whole (BatchVariant.UNPADDED: the MoE runs on the "
            "attention's rows, every attention-TP rank dispatching them)",
            "server arg",
            ("--disable-attn-tp-gather",),
            "per batch",
            _rel(FACTORIES, "_resolve_ffn (BatchVariant.UNPADDED) / layout.batches_are_unpadded"),
        ),
        Gate(
            "norm-on-shard variant only with SGLANG_K3_SP_ATTN_RES=1, the fused SP collectives on, PP 1, every "
            "layer from the first MoE layer on a MoE layer, no EAGLE3/DFlash",
            "env",
            ("SGLANG_K3_SP_ATTN_RES", "--pp-size"),
            "runs baseline",
            _rel(K3, "_carries_bank_slices"),
        ),
        Gate(
            "fused SP reduce-scatter/all-gather: SM100 or SM103, attention-TP group of 4, 8 or 16, "
            "--moe-a2a-backend megamoe or deepep, CustomAllReduceV2 with multicast, SGLANG_K3_SP_COLLECTIVE "
            "not 0; otherwise NCCL",
            "gpu",
            ("SGLANG_K3_SP_COLLECTIVE", "--moe-a2a-backend"),
            "falls back",
            _rel(K3SP, "_init_state"),
            "k3_sp_collective",
        ),
        Gate(
            "fused SP collectives also need a tuning table for the exact device name and attention-TP size; the "
            f"release ships {K3_SP_TABLE_LIST} (hidden 7168); any other device (HGX B200/B300 included) or TP logs "
            "'K3 SP collective has no tuning table for ...; using NCCL'",
            "gpu",
            ("--tp-size",),
            "falls back",
            K3_SP_TABLE_SOURCE,
            "k3_sp_collective_table",
        ),
        Gate(
            "per batch, the table's bucket at or below the batch's token count picks the strategy, and some "
            f"buckets pick NCCL: {K3_SP_NCCL_LIST}",
            "batch",
            ("--chunked-prefill-size",),
            "per batch",
            K3_SP_BUCKET_SOURCE,
            "k3_sp_collective_bucket",
        ),
    ),
    fallback="without the fused collectives SGLang logs 'K3 SP collective requires ...; using NCCL' (or 'has no "
    "tuning table for <device>; using NCCL') and runs "
    "NCCL's RS/AG of the same default path (bank on every row: `sglang-sp-moe`); without SGLANG_K3_SP_ATTN_RES "
    "(or without the fused collectives, which the variant needs) the default path runs",
    fallback_source=_rel(K3SP, "_init_state"),
    derived=("ep_size = tp_size (arg_groups/overrides.py _a2a_ep_size, after parsing)",),
)

__all__ = ["K3_SP_TABLES", "SGL_SP_MOE"]
