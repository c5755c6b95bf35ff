"""Speculative decoding and MTP as the engines run them: the inputs a decode step is priced with, and the flags.

A speculative decode step, as both engines run a chain draft (EAGLE top-k 1, MTP), per running request:
- the draft proposes `draft_tokens` (k) tokens: one draft pass over the verify width (SGLang's draft extend
  of the previous step's verified tokens, vLLM's draft prefill over the step's tokens) and k - 1 one-token
  draft passes (SGLang `EagleDraftWorker.draft_forward`'s loop breaks at its last step; vLLM
  `AutoRegressiveSpeculator._multi_step_decode` runs steps 1 to k - 1);
- the target verifies k + 1 tokens per request at the request's context (SGLang
  `--speculative-num-draft-tokens`; vLLM schedules 1 + num_speculative_tokens tokens per running request
  out of the step's token budget, `Scheduler.schedule`);
- the request gains `accepted` tokens on average, the bonus token included (1 <= accepted <= k + 1).
A prefill step runs the draft too, over the prompt's tokens (`AGG_PREFILL_SOURCES`; a P/D prefill server's,
`PD_PREFILL_SOURCES`). The draft is priced as the engines load and run it (`tpplan.cost.draft`):
- weights: MTP's `num_nextn_predict_layers` nextn layers, each the target's last decoder layer sharded as the
  target's, plus its eh_proj (an unsharded `nn.Linear(2 * hidden, hidden)`) and norms; the embedding and
  lm_head are the target's, shared (SGLang `EAGLEWorkerV2.init_lm_head`, vLLM `load_eagle_model`), and both
  engines load the draft before the KV pool is sized, so its weights come out of the pool;
- KV: the draft's layers cache every token beside the target's in the one pool (SGLang adds
  draft layers x the target's per-layer cell to the cell size; vLLM's KV spec holds the draft's attention
  layers), so the pool holds fewer tokens;
- step: per draft pass, `draft_layers` of the target's last decoder layer, the eh_proj over the pass's
  tokens and the shared lm_head over one token per request (both engines take logits at one position per
  request), with the vocab-parallel logits' all-gather.
EAGLE: the draft is read from its config where DRAFT is a preset, a config.json or a checkpoint folder here
(its own layers at the target's TP, its fc, an lm_head of its own for an EAGLE-3 draft vocabulary); a hub name
is not read: its weights and KV are not priced, and it is timed as MTP's is. Top-k 1
chains only: the launch line passes `--speculative-eagle-topk 1` (SGLang's default without
`--speculative-num-steps` is a top-k 4 tree for Llama, `_auto_choose_speculative_params`); vLLM 0.34.0's
EAGLE/MTP speculators run a chain. Acceptance is an input: tpplan does not predict it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from tpplan.engines.schema import Source
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.spec import ModelSpec

Method = Literal["mtp", "eagle"]

SGLANG_SPEC = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/fields/spec.py",
    "Spec.speculative_algorithm / speculative_num_steps / speculative_eagle_topk / speculative_num_draft_tokens "
    "(NEXTN aliases EAGLE: arg_groups/speculative_hook.py _resolve_speculative_algorithm_alias)",
    "0.5.23 (PyPI wheel)",
)
SGLANG_STEP = Source(
    "sgl-project/sglang",
    "python/sglang/srt/speculative/eagle_worker_v2.py",
    "EAGLEWorkerV2.forward_batch_generation: EagleDraftWorker.draft_forward (num_steps - 1 draft passes), verify "
    "(num_draft_tokens per request), _draft_extend_for_decode (num_draft_tokens per request)",
    "0.5.23 (PyPI wheel)",
)
SGLANG_CAP = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/speculative_hook.py",
    "_handle_eagle_family: max_running_requests defaults to 48 under EAGLE/NEXTN; the draft model path defaults to "
    "the target's for DeepSeek/GLM MTP architectures",
    "0.5.23 (PyPI wheel)",
)
VLLM_SPEC = Source(
    "vllm-project/vllm",
    "vllm/config/speculative.py",
    "SpeculativeConfig.method ('mtp', 'eagle', 'eagle3'; per-model MTP names map to 'mtp') / num_speculative_tokens / "
    "model, set by --speculative-config (engine/arg_utils.py)",
    "0.34.0 (PyPI wheel)",
)
VLLM_STEP = Source(
    "vllm-project/vllm",
    "vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py",
    "AutoRegressiveSpeculator: _prefill over the step's tokens, then _multi_step_decode steps 1 .. "
    "num_speculative_steps - 1; v1/core/sched/scheduler.py Scheduler.schedule takes 1 + num_spec_tokens per "
    "running request from the token budget",
    "0.34.0 (PyPI wheel)",
)
SGLANG_DRAFT_MEMORY = Source(
    "sgl-project/sglang",
    "python/sglang/srt/model_executor/pool_configurator.py",
    "DefaultPoolConfigurator.__init__: under EAGLE/NEXTN the target's cell size grows by cell x "
    "eagle_draft_num_layers / num_layers (model_runner_components/spec_aux_hidden_state.py: the config's "
    "num_nextn_predict_layers, else the draft checkpoint's layers); managers/scheduler.py "
    "init_target_memory_pool sizes the pool after the draft worker loaded (kv_cache_configurator.py "
    "_profile_available_bytes: 'draft weights are now counted'); speculative/eagle_worker_v2.py init_lm_head "
    "shares the target's embedding and lm_head; models/deepseek_nextn.py DeepseekModelNextN: eh_proj "
    "nn.Linear(2 * hidden, hidden), enorm, hnorm, one decoder layer",
    "0.5.23 (PyPI wheel)",
)
SGLANG_TREE = Source(
    "sgl-project/sglang",
    "python/sglang/srt/arg_groups/speculative_hook.py",
    "_auto_choose_speculative_params: without --speculative-num-steps, (steps, topk, draft tokens) = (5, 4, 8) "
    "for LlamaForCausalLM (a tree), (3, 1, 4) for DeepSeek/GLM; given steps and topk are kept",
    "0.5.23 (PyPI wheel)",
)
SGLANG_LOGITS = Source(
    "sgl-project/sglang",
    "python/sglang/srt/layers/logits_processor.py",
    "LogitsProcessor._get_pruned_states: draft extend (DRAFT_EXTEND_V2) keeps the rows at "
    "spec_info.select_index, one per request (speculative/eagle_worker_v2.py _draft_extend_for_decode)",
    "0.5.23 (PyPI wheel)",
)
VLLM_DRAFT_MEMORY = Source(
    "vllm-project/vllm",
    "vllm/v1/worker/gpu/attn_utils.py",
    "get_kv_cache_spec: every attention layer's KV spec, the draft's (is_draft_layer, set by "
    "spec_decode/speculator.py Speculator.load_model) beside the target's, sized alike; "
    "v1/worker/gpu/model_runner.py GPUModelRunner.load_model loads the speculator inside the weights' "
    "DeviceMemoryProfiler; spec_decode/eagle/utils.py load_eagle_model shares the target's embedding and "
    "lm_head; model_executor/models/deepseek_mtp.py DeepSeekMultiTokenPredictorLayer: eh_proj "
    "nn.Linear(2 * hidden, hidden), enorm, hnorm, shared_head.norm, mtp_block",
    "0.34.0 (PyPI wheel)",
)
VLLM_LOGITS = Source(
    "vllm-project/vllm",
    "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
    "TargetDependentARSpeculator: the draft samples at last_token_indices[:num_reqs], one row per request; "
    "config/speculative.py SpeculativeConfig.use_local_argmax_reduction defaults to False (the full logits are "
    "all-gathered)",
    "0.34.0 (PyPI wheel)",
)
SGLANG_EAGLE = Source(
    "sgl-project/sglang",
    "python/sglang/srt/models/llama_eagle3.py",
    "LlamaModel.__init__: fc nn.Linear(target hidden x num_aux_hidden_states (default 3), hidden), unsharded; "
    "LlamaForCausalLMEagle3.__init__: an lm_head of draft_vocab_size rows (ParallelLMHead) unless tied, the "
    "target's loaded when draft_vocab_size is absent; speculative/eagle_worker_v2.py init_lm_head shares the "
    "target's embedding",
    "0.5.23 (PyPI wheel)",
)
VLLM_EAGLE = Source(
    "vllm-project/vllm",
    "vllm/model_executor/models/llama_eagle3.py",
    "LlamaModel.__init__: fc ReplicatedLinear(target hidden x num_aux_hidden_states (default 3), hidden); "
    "Eagle3LlamaForCausalLM.__init__: lm_head ParallelLMHead(draft_vocab_size); llama_eagle.py LlamaModel: fc "
    "ReplicatedLinear(2 x hidden, hidden); spec_decode/eagle/utils.py load_eagle_model shares the target's "
    "embedding and lm_head unless the checkpoint holds its own (models/utils.py process_eagle_weight)",
    "0.34.0 (PyPI wheel)",
)
SGLANG_PD_PREFILL = Source(
    "sgl-project/sglang",
    "python/sglang/srt/disaggregation/prefill.py",
    "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill: under EAGLE/NEXTN the prefill server "
    "keeps each request's first draft top-k and draft hidden state for the decode server, which takes them as its "
    "first draft input (decode.py DecodeTransferQueue._commit_transfer_to_req; managers/scheduler.py "
    "Scheduler.init_disaggregation sizes that metadata at the draft's hidden size only under EAGLE, 16 floats "
    "otherwise); PrefillBootstrapQueue._init_kv_manager appends the draft worker's KV pool to the buffers sent; "
    "speculative/eagle_worker_v2.py EAGLEWorkerV2._forward_prefill_batch runs one draft extend over the prompt's "
    "tokens after the target's prefill (EagleDraftWorker._draft_extend_for_prefill)",
    "0.5.23 (PyPI wheel)",
)
VLLM_PD_PREFILL = Source(
    "vllm-project/vllm",
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py",
    "compute_nixl_compatibility_hash: _get_speculative_compatibility_factors hashes a hidden-state speculator's "
    "method and draft model (EAGLE, MTP), and nixl/base_worker.py NixlBaseConnectorWorker._nixl_handshake raises "
    "on a mismatch (enforce_handshake_compat defaults to true); the draft's attention layers are regions the "
    "connector sends beside the target's (_get_head_sharded_draft_regions: 'draft_model.' regions); "
    "v1/worker/gpu/model_runner.py GPUModelRunner.sample_tokens runs speculator.propose after every step, a "
    "prefill server's too, but a prefill server's requests come with max_tokens 1 (the P/D proxy as "
    "engines/releases/vllm_0_34_0.py ROUTER read it in the sdist's toy_proxy_server.py), so v1/core/sched/scheduler.py "
    "Scheduler._drafts_unused holds for each and the step proposes none (skip_drafts): "
    "spec_decode/target_dependent_ar/speculator.py TargetDependentARSpeculator.propose runs the draft prefill over "
    "the step's tokens to keep the draft's KV and returns before sampling (_prefill skip_sample)",
    "0.34.0 (PyPI wheel)",
)
VLLM_PD_DRAFT_GATE = Source(
    "vllm-project/vllm",
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py",
    "NixlBaseConnectorWorker._validate_remote_agent_handshake: a non-MLA draft under an MLA target (its KV "
    "head-sharded, _resolve_head_sharded_draft_kv_heads) raises NotImplementedError where the decode side's TP is "
    "below the prefill side's (tp_ratio < 0, kv_connector/utils.py TpKVTopology.tp_ratio)",
    "0.34.0 (PyPI wheel)",
)
SGLANG_PD_DRAFT_STATE = Source(
    "sgl-project/sglang",
    "python/sglang/srt/disaggregation/utils.py",
    "MetadataBuffers.__init__: output_hidden_states (one slot of hidden_size x hidden_states_dtype per request), "
    "sized by managers/scheduler.py Scheduler.init_disaggregation as the draft config's spec_hidden_size and dtype "
    "(speculative/eagle_utils.py get_draft_recurrent_hidden_state_spec_from_config; configs/model_config.py "
    "spec_hidden_size: hidden_size, hc-flattened for DeepSeek-V4/Qwen4-Exp) where the algorithm carries draft hidden "
    "states (spec_info.py carries_draft_hidden_states: EAGLE family, NEXTN included), else 16 float32; "
    "disaggregation/mooncake/conn.py send_aux sends each metadata buffer's slot with the request's last KV chunk",
    "0.5.23 (PyPI wheel)",
)
PD_DRAFT_STATE = {"sglang": True, "vllm": False}
"""Whether a P/D prefill server's hand-off carries a request's draft hidden state for the decode server's first
draft (`SGLANG_PD_DRAFT_STATE`); vLLM's prefill server proposes nothing (`VLLM_PD_PREFILL`)."""
PD_PREFILL_SOURCES = {"sglang": SGLANG_PD_PREFILL, "vllm": VLLM_PD_PREFILL}
PREFILL_DRAFT_SAMPLES = {"sglang": True, "vllm": False}
"""Whether a P/D prefill server's draft pass over a step's tokens samples (its lm_head over one token per request):
SGLang's draft extend for prefill proposes the first draft token's top-k for the decode server
(`SGLANG_PD_PREFILL`); vLLM's prefill server proposes nothing and only fills the draft's KV (`VLLM_PD_PREFILL`)."""
SGLANG_AGG_PREFILL = Source(
    "sgl-project/sglang",
    "python/sglang/srt/speculative/eagle_worker_v2.py",
    "EAGLEWorkerV2.forward_batch_generation sends every extend batch (each prefill chunk) to _forward_prefill_batch: "
    "the target's prefill, then EagleDraftWorker._draft_extend_for_prefill, one draft forward over the batch's "
    "tokens (shifted by one, _eagle_prefill_tail_tokens for a chunk) whose logits (layers/logits_processor.py "
    "LogitsProcessor._get_pruned_states: an extend batch's last index per request) give the first draft's top-k; "
    "no draft_forward steps until the request decodes; mixed prefill and decode steps only with "
    "--enable-mixed-chunk (arg_groups/fields/schedule.py, default off)",
    "0.5.23 (PyPI wheel)",
)
VLLM_AGG_PREFILL = Source(
    "vllm-project/vllm",
    "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
    "GPUModelRunner.sample_tokens (v1/worker/gpu/model_runner.py) calls TargetDependentARSpeculator.propose after "
    "every step: _prefill runs the draft over every token of the step (prepare_prefill_inputs: a non-final chunk "
    "takes its next prompt token) and samples at last_token_indices, one row per request, then "
    "_run_multi_step_decode runs num_speculative_tokens - 1 one-token passes over the step's requests; the "
    "scheduler sets K = 0 (skip_drafts) when Scheduler._drafts_unused holds for every request of the step (a "
    "non-final prefill chunk, or a step that samples a request's last token), and _prefill then returns before "
    "sampling (skip_sample)",
    "0.34.0 (PyPI wheel)",
)
AGG_PREFILL_SOURCES = {"sglang": SGLANG_AGG_PREFILL, "vllm": VLLM_AGG_PREFILL}
DRAFT_OVER_WHOLE_STEP = {"sglang": False, "vllm": True}
"""Whether an aggregated server's draft runs once over every token of a step, prefill chunks and decode
requests together (vLLM's propose, `VLLM_AGG_PREFILL`), or a prefill step's draft extend apart from a decode
step's draft (SGLang, whose steps are prefill or decode without --enable-mixed-chunk, `SGLANG_AGG_PREFILL`)."""
SOURCES = {
    "sglang": (
        SGLANG_SPEC,
        SGLANG_STEP,
        SGLANG_CAP,
        SGLANG_DRAFT_MEMORY,
        SGLANG_TREE,
        SGLANG_LOGITS,
        SGLANG_EAGLE,
        SGLANG_AGG_PREFILL,
    ),
    "vllm": (VLLM_SPEC, VLLM_STEP, VLLM_DRAFT_MEMORY, VLLM_LOGITS, VLLM_EAGLE, VLLM_AGG_PREFILL),
}
SGLANG_DEFAULT_RUNNING = 48  # `_handle_eagle_family`'s max_running_requests when none is given

NOT_MODELLED = (
    "speculative decoding: the acceptance is an input (mean accepted tokens per step), not predicted; a request's "
    "decode steps are its output tokens over it, each step's tokens arriving together (ITL is the gap between steps)",
    "speculative decoding: a draft pass is priced as its decoder layers (MTP: the target's last), its projection "
    "into the draft and its lm_head (the target's own lm_head is not priced); top-k 1 chains only (no EAGLE tree)",
    "speculative decoding: a draft layer's KV cell is the target's last layer's (SGLang scales the stage's mean "
    "layer cell: the same where a stage's layers cache alike; vLLM: an EAGLE draft's own); under PP the draft's "
    "weights are on the last stage without an embedding of their own (SGLang's PP draft keeps a copy, "
    "speculative/pp_draft_embedding.py)",
    "speculative decoding: a step with a decoding request is priced as proposing drafts (vLLM proposes none, only "
    "filling the draft's KV, where every request of the step takes its last output token, Scheduler._drafts_unused)",
)
PD_NOT_MODELLED = (
    "speculative decoding in P/D: of the prefill server's per-request metadata for the decode server, only SGLang's "
    "draft hidden state is in the hand-off's bytes (not the first draft's top-k, 16 float32 and 16 int64, nor the "
    "fields sent without speculative decoding, nor the state of an EAGLE draft whose config is not read); "
    "SGLang's running-request cap of 48 "
    "under speculative decoding on the prefill server (its launch line gives none) does not cap a prefill step"
)
EAGLE_NOT_MODELLED = (
    "speculative decoding: the EAGLE draft checkpoint's config is not read (DRAFT is no preset, config.json or "
    "checkpoint folder here): its weights and KV are not in the memory or the KV pool, and a draft pass is priced "
    "as an MTP layer (the target's last decoder layer)"
)
EAGLE_READ_NOT_MODELLED = (
    "speculative decoding: the EAGLE draft is priced from its config: its embedding taken as the target's "
    "(shared), its lm_head its own only where its draft_vocab_size differs from the target's vocabulary (vLLM keeps "
    "whatever head and embedding its checkpoint holds, not read), EAGLE-3's first layer's 2 x hidden attention "
    "input as hidden"
)


@dataclass(frozen=True)
class Speculative:
    """A chain draft of `draft_tokens` (k) tokens per step, `accepted` tokens gained per request per step on
    average (the bonus token included), the draft priced as `draft_layers` of the target's decoder layers."""

    draft_tokens: int
    accepted: float
    method: Method = "mtp"
    draft_layers: int = 1
    draft_model: str | None = None  # EAGLE: the draft checkpoint the launch line loads

    def __post_init__(self) -> None:
        if not 1 <= self.draft_tokens <= 16:
            raise TpplanError(f"spec_draft_tokens={self.draft_tokens}", "must be 1 to 16", "pass the draft's k")
        if not 1.0 <= self.accepted <= self.draft_tokens + 1:
            raise TpplanError(f"spec_accepted={self.accepted:g}", f"must be 1 to draft tokens + 1 = "
                              f"{self.draft_tokens + 1}", "pass the mean tokens a request gains per step")  # fmt: skip
        if not 1 <= self.draft_layers <= 8:
            raise TpplanError(f"spec_draft_layers={self.draft_layers}", "must be 1 to 8", "pass the draft's layers")
        if self.method not in ("mtp", "eagle"):
            raise TpplanError(f"spec_method={self.method}", "is not mtp or eagle", "pass mtp or eagle")
        if self.method == "eagle" and not self.draft_model:
            raise TpplanError("spec_method=eagle", "needs the draft checkpoint", "give spec_draft=CHECKPOINT")

    def check_model(self, model: ModelSpec) -> None:
        """MTP drafts with the model's own nextn layers: refused for a model whose config has none."""
        if self.method == "mtp" and model.mtp_layers == 0:
            why = f"model {model.name} has no MTP layers (num_nextn_predict_layers is 0 or absent from its config)"
            raise TpplanError("spec_method=mtp", why, "use eagle:K:A:DRAFT with a draft checkpoint")

    @property
    def verify_tokens(self) -> int:
        """Tokens the target verifies per request per step: the draft's k and the last accepted token."""
        return self.draft_tokens + 1

    def to_json(self) -> dict[str, object]:
        return {"method": self.method, "draft_tokens": self.draft_tokens, "verify_tokens": self.verify_tokens,
                "accepted_per_step": self.accepted, "draft_layers": self.draft_layers,
                "draft_model": self.draft_model}  # fmt: skip


EAGLE3_METHOD = {
    "sglang": Source(
        "sgl-project/sglang",
        "python/sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
        "the target sets eagle_use_aux_hidden_state only where SpeculativeAlgorithm.is_eagle3() "
        "(speculative/spec_info.py: EAGLE3 apart from EAGLE): an EAGLE-3 draft needs --speculative-algorithm EAGLE3",
        "0.5.23 (PyPI wheel)",
    ),
    "vllm": Source(
        "vllm-project/vllm",
        "vllm/transformers_utils/configs/eagle.py",
        "EAGLEConfig.__init__: method 'eagle' names the draft Eagle<arch>, 'eagle3' Eagle3<arch>; "
        "v1/worker/gpu/spec_decode/eagle/config.py Eagle3SpeculatorConfig (base_method 'eagle3', "
        "uses_aux_hidden_states): an EAGLE-3 draft needs method 'eagle3'",
        "0.34.0 (PyPI wheel)",
    ),
}


def _name(engine: str) -> str:
    return engine.split("@")[0].lower()


def launch_flags(
    engine: str, spec: Speculative, max_running: int | None = None, *, eagle3: bool = False
) -> tuple[str, ...]:
    """The engine's flags for `spec` (chain draft: SGLang top-k 1 with num_draft_tokens = num_steps + 1). SGLang
    lowers its running-request cap to 48 under speculative decoding unless one is given: `max_running` (the
    cap the loop served with) is given as `--max-running-requests`, so the launch line runs what was priced.
    `eagle3`: the EAGLE draft is an EAGLE-3 one (`cost.draft.eagle3_draft`), whose method both engines name
    apart, as it makes the target capture the auxiliary hidden states (`EAGLE3_METHOD`)."""
    method = "eagle3" if eagle3 and spec.method == "eagle" else spec.method
    if _name(engine) == "sglang":
        algo = "NEXTN" if spec.method == "mtp" else method.upper()
        out = [f"--speculative-algorithm {algo}", f"--speculative-num-steps {spec.draft_tokens}",
               "--speculative-eagle-topk 1", f"--speculative-num-draft-tokens {spec.verify_tokens}"]  # fmt: skip
        out += [f"--speculative-draft-model-path {spec.draft_model}"] if spec.draft_model else []
        return (*out, *((f"--max-running-requests {max_running}",) if max_running is not None else ()))
    conf: dict[str, object] = {"method": method, "num_speculative_tokens": spec.draft_tokens}
    if spec.draft_model:
        conf["model"] = spec.draft_model
    return (f"--speculative-config '{json.dumps(conf, separators=(',', ':'))}'",)


def running_cap(engine: str, cap: int | None) -> int | None:
    """The running-request cap under speculative decoding: `cap` where the loop has one (the launch line
    gives it, `launch_flags`), else SGLang's default under speculative decoding, 48."""
    if cap is None and _name(engine) == "sglang":
        return SGLANG_DEFAULT_RUNNING
    return cap


def sources(engine: str, *, eagle3: bool = False) -> tuple[Source, ...]:
    """Where the engine's speculative facts were read (`eagle3`: with where its EAGLE-3 method was)."""
    return (*SOURCES[_name(engine)], *((EAGLE3_METHOD[_name(engine)],) if eagle3 else ()))


def prefill_draft_samples(engine: str) -> bool:
    """Whether a P/D prefill server's draft pass runs its lm_head (`PREFILL_DRAFT_SAMPLES`)."""
    return PREFILL_DRAFT_SAMPLES[_name(engine)]


def draft_over_whole_step(engine: str) -> bool:
    """Whether the aggregated server's draft runs once over a whole step's tokens (`DRAFT_OVER_WHOLE_STEP`)."""
    return DRAFT_OVER_WHOLE_STEP[_name(engine)]


def pd_sends_draft_state(engine: str) -> bool:
    """Whether the P/D hand-off carries the request's draft hidden state (`PD_DRAFT_STATE`)."""
    return PD_DRAFT_STATE[_name(engine)]


def check_pd_draft(engine: str, prefill: Mesh, decode: Mesh, target_latent: bool, draft_latent: bool) -> None:
    """Refuse what the engine's P/D connector refuses for a speculative decode pool (`VLLM_PD_DRAFT_GATE`): on
    vLLM, a draft caching plain attention under a latent-KV (MLA) target where the decode TP is below the
    prefill TP."""
    if _name(engine) == "vllm" and target_latent and not draft_latent and decode.tp < prefill.tp:
        raise TpplanError(
            f"pd=tp{prefill.tp}:tp{decode.tp}",
            "vLLM 0.34.0's NixlConnector refuses a non-MLA draft's KV under an MLA target when the decode TP is below "
            "the prefill TP (nixl/base_worker.py NixlBaseConnectorWorker._validate_remote_agent_handshake)",
            "give the decode pool a TP at least the prefill pool's, or use an MLA draft (mtp)",
        )


__all__ = [
    "AGG_PREFILL_SOURCES",
    "DRAFT_OVER_WHOLE_STEP",
    "EAGLE_NOT_MODELLED",
    "EAGLE_READ_NOT_MODELLED",
    "NOT_MODELLED",
    "PD_DRAFT_STATE",
    "PD_NOT_MODELLED",
    "PD_PREFILL_SOURCES",
    "PREFILL_DRAFT_SAMPLES",
    "SOURCES",
    "Speculative",
    "check_pd_draft",
    "draft_over_whole_step",
    "launch_flags",
    "pd_sends_draft_state",
    "prefill_draft_samples",
    "running_cap",
    "sources",
]
