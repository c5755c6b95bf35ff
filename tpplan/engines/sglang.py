"""SGLang, as read: the current release (0.5.23, its PyPI wheel's sources) and an older main
revision (the `layers/communicator/` package, commits from the code index) where behaviour differs.

Paths of the release are those of the repository (`python/sglang/...`); in 0.5.23 the layer
communicator is `python/sglang/srt/layers/layer_boundary/`, earlier `layers/communicator/`. The
SP-MoE mode (DeepEP beside attention TP, per model class) is `sglang_sp_moe.py`; where the code was
read, `sglang_source.py`. The versions themselves (these records with each release's scheduler, KV
sizing and P/D hand-off) are modules of `tpplan/engines/releases/`.
"""

from __future__ import annotations

from dataclasses import replace

from tpplan.engines.schema import (
    CollectiveDefault,
    Comm,
    Gate,
    Mode,
    NotWired,
    Op,
    PipelineSchedule,
    Support,
    Wiring,
)
from tpplan.engines.sglang_source import LB
from tpplan.engines.sglang_source import old as _old
from tpplan.engines.sglang_source import rel as _rel
from tpplan.engines.sglang_sp_moe import SGL_SP_MOE

OLD = "python/sglang/srt/layers/communicator"


# --------------------------------------------------------------------------------------------
# --enable-attn-tp-input-scattered

INIT_CONTEXT = _rel(f"{LB}/adapters/attention.py", "AttnTpContext.init_context")
CONFIGURED = _rel(f"{LB}/layout.py", "input_scattered_configured")
PER_BATCH = _rel(f"{LB}/adapters/attention.py", "AttnTpContext.use_input_scattered")
RS_TP = _rel(f"{LB}/ops.py", "tp_reduce_scatter")
# The eager forward pads an input-scattered extend batch to a multiple of tp_size before the model runs
# (ModelRunner._prepare_eager_forward_batch calls it when no MLP-sync pass does; prepare_mlp_sync_batch pads
# each rank's count to a multiple of attn_tp_size the same way).
PAD_TO_TP = _rel(
    "python/sglang/srt/model_executor/forward_batch_info.py",
    "ForwardBatch.prepare_attn_tp_scatter_input -> _pad_inputs_to_size",
)
LATENT_AG = _rel(f"{LB}/adapters/attention.py", "AttentionInputs.fetch_qkv_latent")
FOLD_AR = _rel(f"{LB}/prepare.py", "_tp_sum_with_residual_read -> _tp_all_reduce_with_scattered_residual")
DSV2 = _rel("python/sglang/srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM (init_context, maybe_input_scattered)")

DSV3_INPUT_SCATTERED = (
    Comm("RS", "the previous FFN's partial sum, onto the rank's T/N rows", "hidden", RS_TP),
    Op("input_layernorm (fused residual add, residual slice)", "T/N"),
    Op("fused_qkv_a_proj_with_mqa", "T/N"),
    Comm("AG", "the QKV latent (q_lora + kv_lora + rope)", "qkv_latent", LATENT_AG),
    Op("q_b_proj, kv_b_proj, attention, o_proj (head-parallel)", "T"),
    Comm("AR", "o_proj partial sum with the rank's residual slice folded into its rows", "hidden", FOLD_AR),
    Op("post_attention_layernorm", "T"),
    Op("MLP / MoE (tensor parallel; leaves its sum for the next layer's reduce-scatter)", "T"),
)

_INPUT_SCATTERED_GATES = (
    Gate(
        "--enable-attn-tp-input-scattered is set",
        "server arg",
        ("--enable-attn-tp-input-scattered",),
        "runs baseline",
        CONFIGURED,
    ),
    Gate("tensor parallelism (tp_size > 1)", "server arg", ("--tp-size",), "runs baseline", CONFIGURED, "tp_gt_1"),
    Gate("DP attention off", "server arg", ("--enable-dp-attention",), "runs baseline", CONFIGURED, "no_dp_attention"),
    Gate(
        "no prefill context parallelism sharding tokens (attn_cp_size > 1 with --enable-prefill-cp)",
        "server arg",
        ("--attn-cp-size", "--enable-prefill-cp"),
        "runs baseline",
        CONFIGURED,
        "no_prefill_cp",
    ),
    Gate("--moe-a2a-backend none", "server arg", ("--moe-a2a-backend",), "runs baseline", CONFIGURED),
    Gate(
        "dense FFN not fully data-parallel (--moe-dense-tp-size is not 1)",
        "server arg",
        ("--moe-dense-tp-size",),
        "runs baseline",
        CONFIGURED,
    ),
    Gate("CUDA or NPU", "gpu", (), "runs baseline", INIT_CONTEXT),
    Gate(
        "the attention has a q_lora_rank latent (fused qkv_a)", "model", (), "runs baseline", INIT_CONTEXT, "mla_q_lora"
    ),
    Gate(
        "not a DSA model (DeepSeek-V3.2 / GLM-5 sparse attention) unless MHC pre-gathers",
        "model",
        (),
        "runs baseline",
        INIT_CONTEXT,
        "not_dsa",
    ),
    Gate(
        "prefill CUDA graph backend is not tc_piecewise (the release's default prefill backend is "
        "`disabled`, so no flag is needed)",
        "server arg",
        ("--cuda-graph-backend-prefill",),
        "runs baseline",
        INIT_CONTEXT,
    ),
    Gate(
        "speculative algorithm is not EAGLE3", "server arg", ("--speculative-algorithm",), "runs baseline", INIT_CONTEXT
    ),
    Gate(
        "per batch: extend (prefill) batches only, not target-verify, not two-batch-overlap, input_ids set",
        "batch",
        ("--enable-two-batch-overlap", "--speculative-algorithm"),
        "per batch",
        PER_BATCH,
    ),
    Gate(
        "every prefill batch is padded to a multiple of TP before the layers run (ceil(T / tp) x tp rows, up to "
        "tp - 1 dummy rows), so tp_reduce_scatter's T % tp == 0 assertion holds for every chunk length",
        "batch",
        ("--chunked-prefill-size",),
        "adjusts",
        PAD_TO_TP,
        "input_scattered_pads",
    ),
)

SGL_INPUT_SCATTERED = Mode(
    name="input-scattered",
    flags=("--enable-attn-tp-input-scattered", "--moe-a2a-backend none"),
    summary="RS(hidden) + AG(QKV latent) + AR(hidden) per layer: only input_layernorm and qkv_a on T/N",
    wiring=(
        Wiring(
            model_types=("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32"),
            architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"),
            layers="every layer whose attention has a q_lora_rank latent",
            dataflow=DSV3_INPUT_SCATTERED,
            plan="sglang-input-scattered",
            source=DSV2,
            differences=(
                "the last layer's FFN all-reduces instead of leaving its sum (hands_on_partial is False on "
                "the last layer); tpplan reduce-scatters it into the final norm",
            ),
        ),
    ),
    not_wired=(
        NotWired(
            ("kimi_k3",),
            "baseline",
            "kimi_k3.py builds its own attention-residual layers and never enters "
            "AttnTpContext.maybe_input_scattered or init_context, so the flag changes nothing",
            _rel("python/sglang/srt/models/kimi_k3.py", "KimiK3DecoderLayer._run_self_attn"),
        ),
        NotWired(
            ("kimi_linear",),
            "baseline",
            "kimi_linear.py declares its stages without a QKV-latent hook and never enters "
            "maybe_input_scattered, so the flag changes nothing",
            _rel("python/sglang/srt/models/kimi_linear.py", "KimiDecoderLayer (declare_attn/declare_ffn)"),
        ),
        NotWired(
            ("qwen3", "qwen3_moe", "llama", "mistral", "qwen2"),
            "baseline",
            "only deepseek_v2.py, deepseek_v4.py, glm4_moe_lite.py, glm5_next.py and kimi_k25_eagle3.py enter "
            "maybe_input_scattered; GQA models have no q_lora latent",
            _rel("python/sglang/srt/models/", "grep maybe_input_scattered"),
        ),
    ),
    gates=_INPUT_SCATTERED_GATES,
    fallback="a failed static gate logs 'attn_tp_input_scattered is not enabled while other conditions are "
    "not met' (info) and every layer runs the all-reduce path",
    fallback_source=INIT_CONTEXT,
)

# --------------------------------------------------------------------------------------------
# --enable-layernorm-sp

LNSP_HOOK = _rel("python/sglang/srt/arg_groups/layernorm_sp_hook.py", "validate_layernorm_sp")
LNSP = _rel("python/sglang/srt/layers/layernorm_sp.py", "initialize_layernorm_sp / runs_sp")
LNSP_AG = _rel("python/sglang/srt/layers/layernorm_sp.py", "column_parallel_g_matmul (all-gather inside the GEMM)")
LNSP_RS = _rel("python/sglang/srt/layers/layernorm_sp.py", "row_parallel_gbar_matmul (reduce-scatter out of the GEMM)")
SGL_LAYERNORM_SP = Mode(
    name="layernorm-sp",
    flags=("--enable-layernorm-sp",),
    summary="Megatron sequence parallelism on prefill: RS + AG around each block, norms on T/N",
    wiring=(
        Wiring(
            model_types=("qwen3",),
            architectures=("Qwen3ForCausalLM",),
            layers="every layer (EXTEND batches)",
            dataflow=(
                Comm("RS", "the previous block's output onto T/N rows", "hidden", LNSP_RS),
                Op("input_layernorm (fused residual add)", "T/N"),
                Comm("AG", "normed attention input", "hidden", LNSP_AG),
                Op("qkv_proj, attention, o_proj", "T"),
                Comm("RS", "o_proj partial sum", "hidden", LNSP_RS),
                Op("post_attention_layernorm", "T/N"),
                Comm("AG", "normed MLP input", "hidden", LNSP_AG),
                Op("gate_up_proj, down_proj", "T"),
            ),
            plan="sequence-parallel",
            source=LNSP,
        ),
    ),
    not_wired=(
        NotWired(
            ("llama", "deepseek_v3", "kimi_k3", "kimi_linear", "qwen3_moe"),
            "refused",
            "architectures outside SP_SUPPORTED_ARCHITECTURES (Qwen3ForCausalLM and Muse Spark) are refused "
            "by validate_layernorm_sp",
            LNSP_HOOK,
        ),
    ),
    gates=(
        Gate(
            "architecture in SP_SUPPORTED_ARCHITECTURES (Qwen3ForCausalLM, Muse Spark)",
            "model",
            (),
            "refuses",
            LNSP_HOOK,
            "layernorm_sp_arch",
        ),
        Gate("tp_size > 1", "server arg", ("--tp-size",), "refuses", LNSP_HOOK, "tp_gt_1"),
        Gate("no DP attention", "server arg", ("--enable-dp-attention",), "refuses", LNSP_HOOK, "no_dp_attention"),
        Gate(
            "no speculative decoding (Muse Spark DFLASH excepted)",
            "server arg",
            ("--speculative-algorithm",),
            "refuses",
            LNSP_HOOK,
        ),
        Gate("no pipeline stages (pp_size 1)", "server arg", ("--pp-size",), "refuses", LNSP_HOOK, "pp_is_1"),
        Gate("prefill (EXTEND) batches only", "batch", (), "per batch", LNSP),
    ),
    fallback="a failed check raises ValueError at startup",
    fallback_source=LNSP_HOOK,
)

# --------------------------------------------------------------------------------------------
# --enable-dp-attention (tpplan prices it at attention TP 1: plans dp-attention, dp-attention-maxlen, dp-attention+a2a)

DPA = "python/sglang/srt/layers/dp_attention.py"
SGL_DP_ATTENTION = Mode(
    name="dp-attention",
    flags=("--enable-dp-attention", "--dp-size <dp>"),
    summary="attention on each DP rank's own requests (attention TP = tp/dp); the MLP/MoE input gathered over "
    "the DP ranks and its output scattered back",
    wiring=(
        Wiring(
            model_types=("deepseek_v3", "deepseek_v2", "kimi_k2", "kimi_k25", "kimi_k3", "qwen3_moe"),
            architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK3ForCausalLM"),
            layers="every layer",
            dataflow=(
                Op("input_layernorm, attention on the DP rank's own tokens (attention TP inside the DP group)", "T/N"),
                Comm(
                    "AR",
                    "o_proj partial sum over the attention-TP group",
                    "hidden",
                    _rel(f"{LB}/ops.py", "CommunicateSummableTensorPairFn"),
                ),
                Comm(
                    "AG",
                    "MLP input gathered over DP: extend batches over several DP ranks use SUM_LEN (every "
                    "rank's rows in its slot of a sum-length buffer, then an all-reduce); MAX_LEN (padded to the "
                    "longest rank, all_gather_into_tensor) only with pplx, SGLANG_DEEPEP_V2_FORCE_MAX_LEN or idle "
                    "ranks of hybrid-SSM models",
                    "hidden",
                    _rel(DPA, "DpPaddingMode.get_dp_padding_mode"),
                ),
                Op("MLP / MoE over all TP ranks", "T"),
                Comm(
                    "RS",
                    "MLP output back to each DP rank's tokens (dp_reduce_scatter_tensor under MAX_LEN, "
                    "reduce_scatterv or all-reduce + dp_scatter otherwise)",
                    "hidden",
                    _rel(f"{LB}/ops.py", "_reduce_and_redistribute_output_step"),
                ),
            ),
            plan=None,
            source=_rel(DPA, "dp_gather_partial / dp_scatter / dp_reduce_scatter_tensor"),
            differences=(
                "tpplan's DP-attention plans (`dp-attention`: SUM_LEN gather, `dp-attention-maxlen`: MAX_LEN, "
                "`dp-attention+a2a`: DeepEP MoE; tpplan.plans.named, flags from tpplan.engines.recipes.dp_attention) "
                "run attention TP 1 (--dp-size equal to --tp-size), where the attention-TP all-reduce above "
                "vanishes; attention TP > 1 inside a DP group (dp < tp) has no tpplan plan",
            ),
        ),
    ),
    not_wired=(),
    gates=(
        Gate(
            "input-scattered, layernorm-SP and SP-MoE's attention-TP scatter are off under DP attention",
            "server arg",
            ("--enable-dp-attention",),
            "adjusts",
            CONFIGURED,
        ),
    ),
    fallback="-",
    fallback_source=_rel(DPA, "DpPaddingMode"),
)

PP_MIXIN = "python/sglang/srt/managers/scheduler_pp_mixin.py"
PIPELINE = PipelineSchedule(
    in_flight="pp_size + pp_async_batch_depth micro-batches (--pp-async-batch-depth, default 0): the event loop "
    "walks pp_loop_size micro-batch slots; after launching micro-batch i, stage 0 receives and processes the outputs "
    "of the micro-batch pp_loop_size - 1 slots back before it schedules the next one, so a micro-batch enters only "
    "once the one pp_loop_size earlier has left the last stage",
    extra_in_flight=0,
    source=_rel(PP_MIXIN, "event_loop_pp / init_pp_loop_state / _pp_send_recv_and_preprocess_output_tensors"),
    chunks_of_one_request="they pipeline: a chunked request stays Scheduler.chunked_req, and the next micro-batch's "
    "get_new_batch_prefill adds its next chunk at once, without the previous chunk's result (Req."
    "inflight_middle_chunks counts the chunks in flight); a micro-batch holds at most --chunked-prefill-size tokens, "
    "the chunked request first, then waiting requests first-come first-served (PrefillAdder), at most "
    "pp_max_micro_batch_size requests (default max_running_requests // pp_size)",
    chunks_overlap=True,
    chunks_source=_rel("python/sglang/srt/managers/scheduler.py", "Scheduler._get_new_batch_prefill_raw"),
    boundary="PPProxyTensors point-to-point: send_tensor_dict(all_gather_group=attn_tp_group) sends each "
    "attention-TP rank's 1/N slice of every tensor and the next stage's recv_tensor_dict all-gathers it over "
    "attention TP, so a token-sharded stream is gathered too (to_pp completes every owed sum before transport); "
    "the tensors are hidden_states and residual",
    boundary_models=(
        (
            ("kimi_k3",),
            ", for Kimi-K3 the stream head alone (its residual folded in) plus "
            "attn_res_bank, the [T, ceil(end_layer / block), H] snapshot bank",
        ),
    ),
    boundary_gathers=True,
    boundary_source=_rel("python/sglang/srt/distributed/parallel_state.py", "GroupCoordinator.send_tensor_dict"),
    more_sources=(
        _old(PP_MIXIN, "event_loop_pp (the same pp_loop_size slots, an older revision)", "00ff98d34dc4ce18f0"),
        _rel(f"{LB}/residual/batch.py", "to_pp / fold"),
        _rel("python/sglang/srt/models/kimi_k3.py", "KimiK3LinearModel.forward"),
        _rel("python/sglang/srt/layers/attn_residual.py", "AttnResidual.__init__"),
    ),
    not_modelled=(
        "--enable-dynamic-chunking (off by default) resizes chunks under PP to even out their times",
        "PP turns the overlap schedule off (arg_groups/overrides.py _pipeline_parallel_overlap_disable): the "
        "scheduler's CPU time per micro-batch is not priced",
        "the PD-disaggregated prefill loop (event_loop_pp_disagg_prefill) and its KV transfer: sgl-project/sglang "
        "issue 34815 (open) reports a load-independent ~31 s TTFT p50 at PP8 x TP1 against 2.33 s at TP8 on Kimi-K3, "
        "cause not established; the model predicts no such floor",
        "pp_max_micro_batch_size (default max_running_requests // pp_size) is taken not to bind: every waiting "
        "request fits a micro-batch's token budget",
    ),
)

# --pp-size: SGLang starts any model with pp_size > 1; a model class runs PP when its backbone splits its
# layers over the PP ranks (make_pp_layers: start_layer / end_layer, PPMissingLayer for the rest) and passes
# PPProxyTensors between stages. Read per model file of the release (tpplan's model types only).
_PP_HOW = "{cls} splits its layers over the PP ranks (make_pp_layers; PPMissingLayer outside the rank's range) and "
_PP_HOW += "its forward takes and returns PPProxyTensors between stages"
PP_SUPPORT = tuple(
    Support(
        "--pp-size",
        types,
        _PP_HOW.format(cls=cls),
        _rel(f"python/sglang/srt/models/{file}", f"{cls}.__init__ / forward"),
    )
    for types, cls, file in (
        (("kimi_k3",), "KimiK3LinearModel", "kimi_k3.py"),
        # glm4_moe.py GlmMoeDsaForCausalLM and kimi_k25.py KimiK25ForConditionalGeneration (its language model a
        # DeepseekV3ForCausalLM, forward passing pp_proxy_tensors) run DeepseekV2ForCausalLM's model
        (
            ("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32", "glm_moe_dsa", "kimi_k25"),
            "DeepseekV2Model",
            "deepseek_v2.py",
        ),
        (("qwen3", "qwen2"), "Qwen2Model (Qwen3Model's base)", "qwen2.py"),
        (("qwen3_moe",), "Qwen2MoeModel (Qwen3MoeModel's base)", "qwen2_moe.py"),
        (("llama", "mistral"), "LlamaModel", "llama.py"),  # mistral.py MistralForCausalLM extends LlamaForCausalLM
        (("kimi_linear",), "KimiLinearModel", "kimi_linear.py"),
        (("mixtral",), "MixtralModel", "mixtral.py"),
        (("glm4_moe",), "Glm4MoeModel", "glm4_moe.py"),
        (("gpt_oss",), "GptOssModel", "gpt_oss.py"),
        (("minimax_m2",), "MiniMaxM2Model", "minimax_m2.py"),
        (("qwen3_5", "qwen3_5_moe"), "Qwen3_5ForCausalLM", "qwen3_5.py"),
    )
)
# Model classes SGLang refuses --pp-size for: ModelRunner.__init__ asserts "Pipeline Parallel is not compatible with
# this model." when the model's forward takes no pp_proxy_tensors (model_executor/model_runner.py, after loading).
_NO_PP = "{cls}.forward takes no pp_proxy_tensors: ModelRunner.__init__ asserts 'Pipeline Parallel is not compatible "
_NO_PP += "with this model.' after loading the weights (model_executor/model_runner.py)"
PP_REFUSED = (
    *(
        Support("--pp-size", types, _NO_PP.format(cls=cls), _rel(f"python/sglang/srt/models/{file}", f"{cls}.forward"),
                runs=False)
        for types, cls, file in (
            (("gemma3",), "Gemma3ForConditionalGeneration", "gemma3_mm.py"),
            (("gemma3_text",), "Gemma3ForCausalLM", "gemma3_causal.py"),
            (("llama4",), "Llama4ForConditionalGeneration", "mllama4.py"),
        )
    ),
    Support("--pp-size", ("qwen3_next",),
            "Qwen3NextForCausalLM.__init__ asserts pp_group.is_first_rank and is_last_rank (PP 1 only), and its "
            "forward takes no pp_proxy_tensors",
            _rel("python/sglang/srt/models/qwen3_next.py", "Qwen3NextForCausalLM.__init__ / forward"), runs=False),
    Support("--pp-size", ("llama4_text",),
            "Llama4ForCausalLM passes ModelRunner's check (LlamaForCausalLM.forward takes pp_proxy_tensors), but "
            "Llama4Model builds every layer on every rank (make_layers, not make_pp_layers) and never reads "
            "pp_proxy_tensors, and a non-last rank returns a plain tensor: no pipeline split; what the PP "
            "scheduler then does with it was not read",
            _rel("python/sglang/srt/models/llama4.py", "Llama4Model.__init__ / forward"), runs=None),
)  # fmt: skip

# NCCL's NVLS: the launcher writes NCCL_NVLS_ENABLE before NCCL starts, "0" unless a flag asks for NVLS.
NCCL_NVLS = CollectiveDefault(
    setting="NCCL_NVLS_ENABLE",
    nvls=False,
    text="the launcher sets NCCL_NVLS_ENABLE=0 (NVLink SHARP off) unless NCCL_NVLS_ENABLE is already in the "
    "environment, or --enable-nccl-nvls or --enable-symm-mem is passed (either sets it to 1, overriding the "
    "environment); both flags default to False",
    enable=("--enable-nccl-nvls",),
    source=_rel("python/sglang/srt/entrypoints/engine.py", "_set_envs_and_config (enable_nccl_nvls, enable_symm_mem)"),
)

# --------------------------------------------------------------------------------------------
# An older main revision (layers/communicator/): the dataflow is the same, some gates differ.

_OLD_ATTN = _old(
    f"{OLD}/adapters/attention.py", "AttnTpContext.init_context", "7665ff96bba8e757ca0078f762d67ad9389cd75d"
)
_OLD_OPS = _old(
    f"{OLD}/ops.py",
    "_mlp_input_residual_into_sum -> _tp_all_reduce_with_scattered_residual",
    "4eb3ad5a3d5efab835a93d05b922757f5fdeb539",
)
_OLD_K3SP = _old("python/sglang/srt/layers/k3_sp_collective.py", "_init_state", "10e1be0e")
_OLD_RS = _old(f"{OLD}/ops.py", "tp_reduce_scatter", "4eb3ad5a3d5efab835a93d05b922757f5fdeb539")
# The code index holds no copy of forward_batch_info.py at 7665ff96; this main commit imports get_attn_tp_context
# from the same layers/communicator/ package and pads as 0.5.23 does (tokens rounded up to a multiple of tp_size).
_OLD_PADS = _old(
    "python/sglang/srt/model_executor/forward_batch_info.py",
    "ForwardBatch.prepare_attn_tp_scatter_input -> _pad_inputs_to_size",
    "003bbaf9ab79c09933e7a17ae6460ac48a756de9",
)


def older_input_scattered() -> Mode:
    """Input-scattered at the older revision: 0.5.23's dataflow, cited at the commits read there."""

    def cite(step):  # the same dataflow, read at the older commits
        if isinstance(step, Comm):
            src = {"RS": _OLD_RS, "AR": _OLD_OPS}.get(step.collective, _OLD_ATTN)
            return replace(step, source=src)
        return step

    w = SGL_INPUT_SCATTERED.wiring[0]
    gates = tuple(
        replace(g, source=_OLD_PADS if g.check == "input_scattered_pads" else _OLD_ATTN)
        for g in SGL_INPUT_SCATTERED.gates
    )
    return replace(
        SGL_INPUT_SCATTERED,
        wiring=(replace(w, dataflow=tuple(cite(s) for s in w.dataflow), source=_OLD_ATTN),),
        gates=gates,
        fallback_source=_OLD_ATTN,
    )


def older_sp_moe() -> Mode:
    """SP-MoE at the older revision: only its fused-collective gate was read there."""

    read_in_release = ("k3_sp_collective_table", "k3_sp_collective_bucket")  # the table files of 0.5.23's wheel
    gates = tuple(
        replace(
            g,
            text="fused SP reduce-scatter/all-gather: SM103 only (B300/GB300), attention-TP group of 4 or 8, "
            "--moe-a2a-backend megamoe or deepep, CustomAllReduceV2 with multicast, a tuning table for the device "
            "at hidden 7168, SGLANG_K3_SP_COLLECTIVE not 0; otherwise NCCL",
            source=_OLD_K3SP,
            check="k3_sp_collective_sm103",
        )
        if g.check == "k3_sp_collective"
        else g
        for g in SGL_SP_MOE.gates
        if g.check not in read_in_release
    )
    return replace(SGL_SP_MOE, gates=gates, fallback_source=_OLD_K3SP)


__all__ = [
    "NCCL_NVLS",
    "PIPELINE",
    "PP_REFUSED",
    "PP_SUPPORT",
    "SGL_DP_ATTENTION",
    "SGL_INPUT_SCATTERED",
    "SGL_LAYERNORM_SP",
    "older_input_scattered",
    "older_sp_moe",
]
