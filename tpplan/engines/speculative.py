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
The draft is priced as `draft_layers` of the target's own last decoder layer (DeepSeek's MTP module is one
decoder layer of the target's structure, `DeepseekModelNextN`); the draft's lm_head and eh_proj are not
priced (the target's lm_head is not either). Acceptance is an input: tpplan does not predict it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from tpplan.engines.schema import Source
from tpplan.errors import TpplanError

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
SOURCES = {"sglang": (SGLANG_SPEC, SGLANG_STEP, SGLANG_CAP), "vllm": (VLLM_SPEC, VLLM_STEP)}
SGLANG_DEFAULT_RUNNING = 48  # `_handle_eagle_family`'s max_running_requests when none is given

NOT_MODELLED = (
    "speculative decoding: the acceptance is an input (mean accepted tokens per step), not predicted; a request's "
    "decode steps are its output tokens over it, each step's tokens arriving together (ITL is the gap between steps)",
    "speculative decoding: the draft is priced as the target's last decoder layer per draft pass (no lm_head, no "
    "eh_proj); its weights and KV are not in the memory or the KV pool; top-k 1 chains only (no EAGLE tree)",
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

    @property
    def verify_tokens(self) -> int:
        """Tokens the target verifies per request per step: the draft's k and the last accepted token."""
        return self.draft_tokens + 1

    def to_json(self) -> dict[str, object]:
        return {"method": self.method, "draft_tokens": self.draft_tokens, "verify_tokens": self.verify_tokens,
                "accepted_per_step": self.accepted, "draft_layers": self.draft_layers,
                "draft_model": self.draft_model}  # fmt: skip


def _name(engine: str) -> str:
    return engine.split("@")[0].lower()


def launch_flags(engine: str, spec: Speculative, max_running: int | None = None) -> tuple[str, ...]:
    """The engine's flags for `spec` (chain draft: SGLang top-k 1 with num_draft_tokens = num_steps + 1). SGLang
    lowers its running-request cap to 48 under speculative decoding unless one is given: `max_running` (the
    cap the loop served with) is given as `--max-running-requests`, so the launch line runs what was priced."""
    if _name(engine) == "sglang":
        algo = "NEXTN" if spec.method == "mtp" else "EAGLE"
        out = [f"--speculative-algorithm {algo}", f"--speculative-num-steps {spec.draft_tokens}",
               "--speculative-eagle-topk 1", f"--speculative-num-draft-tokens {spec.verify_tokens}"]  # fmt: skip
        out += [f"--speculative-draft-model-path {spec.draft_model}"] if spec.draft_model else []
        return (*out, *((f"--max-running-requests {max_running}",) if max_running is not None else ()))
    conf: dict[str, object] = {"method": spec.method, "num_speculative_tokens": spec.draft_tokens}
    if spec.draft_model:
        conf["model"] = spec.draft_model
    return (f"--speculative-config '{json.dumps(conf, separators=(',', ':'))}'",)


def running_cap(engine: str, cap: int | None) -> int | None:
    """The running-request cap under speculative decoding: `cap` where the loop has one (the launch line
    gives it, `launch_flags`), else SGLang's default under speculative decoding, 48."""
    if cap is None and _name(engine) == "sglang":
        return SGLANG_DEFAULT_RUNNING
    return cap


def sources(engine: str) -> tuple[Source, ...]:
    return SOURCES[_name(engine)]


__all__ = ["NOT_MODELLED", "SOURCES", "Speculative", "launch_flags", "running_cap", "sources"]
