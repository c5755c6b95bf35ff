"""A P/D prefill pool: requests come from a router one by one, each prefill instance runs the engine's
loop, and a finished prompt's KV goes to the decode side over the cluster's fabric before its first
token does.

Hand-off time: each rank of the prefill instance sends its share of the prompt's KV (every layer of
its stage, `Predictor.kv_per_token` x the prompt's tokens) to its peer on the decode side, all ranks at
once, priced as a point-to-point send between nodes on the cluster (`cost.collective_pricer.price_collective`,
"send_recv": the cluster's curve or link model). Whether the engine blocks on it is read from source:
neither SGLang's prefill server (`DISAGG_SOURCE`) nor vLLM's with NixlConnector (`VLLM_HANDOFF_SOURCE`)
does, so the hand-off delays the first token, not the next step; the KV stays held meanwhile (KV
capacity is not modelled here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.draft import DraftMemory
from tpplan.cost.predictor import Predictor
from tpplan.cost.segments import cached_tokens
from tpplan.engines.schema import Source
from tpplan.engines.speculative import pd_sends_draft_state
from tpplan.simulate.engine import EngineLoop
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.requests import Request

DISAGG_SOURCE = Source(
    "sgl-project/sglang",
    "python/sglang/srt/disaggregation/prefill.py",
    "SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill / process_disagg_prefill_inflight_queue",
    "0.5.23 (PyPI wheel)",
)
"""After each batch the loop polls the requests whose KV is in transfer (`disagg_prefill_inflight_queue`,
KVPoll) and answers those done; it never waits for a transfer before the next batch."""
VLLM_HANDOFF_SOURCE = Source(
    "vllm-project/vllm",
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py",
    "NixlPullConnectorScheduler.request_finished (via v1/core/sched/scheduler.py Scheduler._free_request / "
    "_connector_finished); nixl/connector.py NixlBaseConnector.save_kv_layer / wait_for_save",
    "0.34.0 (PyPI wheel)",
)
"""NixlConnector (= NixlPullConnector, the connector tpplan's vLLM P/D lines print): a finished prefill request
returns at once with its block ids (kv_transfer_params) and only its blocks stay held (delay_free_blocks, until
the decode side has read them or their lease ends); the worker saves nothing (save_kv_layer is a no-op,
wait_for_save copies to a host buffer only with kv_buffer_device cpu), so the next step never waits for a
transfer."""
HANDOFF_SOURCES = {"sglang": DISAGG_SOURCE, "vllm": VLLM_HANDOFF_SOURCE}
HANDOFF_BLOCKS = {"sglang": False, "vllm": False}  # read in each engine's prefill-side code (HANDOFF_SOURCES)


def _stage_kv_bytes(p: Predictor, tokens: int, draft: DraftMemory | None) -> list[float]:
    """KV bytes one rank of each stage holds for a prompt of `tokens` tokens, the draft's layers on the last."""
    layers = p.graph.spec.layers
    per_stage = [sum(p.kv_per_token(layers[j].attn) * cached_tokens(layers[j].attn, [tokens]) for j in rng)
                 for rng in p.stages]  # fmt: skip
    if draft is not None:
        attn = draft.attn or layers[-1].attn
        per_stage[-1] += draft.layers * p.kv_per_token(attn) * cached_tokens(attn, [tokens])
    return per_stage


def kv_bytes_per_rank(p: Predictor, tokens: int, draft: DraftMemory | None = None) -> float:
    """KV bytes one rank of the fullest stage holds for a prompt of `tokens` tokens; `draft`: a speculative
    draft's layers, cached beside the target's on the last stage and sent with them (SGLang and vLLM,
    `tpplan.engines.speculative.PD_PREFILL_SOURCES`), each at its own attention or the target's last layer's."""
    return max(_stage_kv_bytes(p, tokens, draft))


def draft_state_bytes(p: Predictor, draft: DraftMemory | None) -> float:
    """Bytes a request's hand-off carries beside its KV for the decode server's first draft: SGLang's prefill
    server writes the draft's hidden state into the request's metadata (spec_hidden_size x the activation
    dtype, `tpplan.engines.speculative.SGLANG_PD_DRAFT_STATE`); vLLM's prefill server proposes nothing (0)."""
    if draft is None or not pd_sends_draft_state(p.pipeline.engine):
        return 0.0
    return float(draft.hidden * p.b)


def handoff_bytes_per_rank(p: Predictor, tokens: int, draft: DraftMemory | None = None) -> float:
    """Bytes one rank of the fullest stage sends for a prompt of `tokens` tokens: its KV (`kv_bytes_per_rank`)
    and, on the last stage, the request's draft state (`draft_state_bytes`)."""
    per_stage = _stage_kv_bytes(p, tokens, draft)
    per_stage[-1] += draft_state_bytes(p, draft)
    return max(per_stage)


def handoff(p: Predictor) -> Callable[[Request], float]:
    """Seconds to send a request's KV from the prefill instance to the decode side, across nodes."""

    def seconds(r: Request) -> float:
        return price_collective("send_recv", kv_bytes_per_rank(p, r.prompt_tokens), 2, p.topo, ranks_per_node=1).time_s

    return seconds


def prefill_pool(loop: EngineLoop, p: Predictor) -> tuple[LoopConfig, str]:
    """The engine's loop as a P/D prefill instance: the hand-off added, blocking as the engine does;
    and the source of that (each engine's prefill side read: neither blocks)."""
    engine = loop.pipeline.engine.split("@")[0]
    return (
        replace(loop.config, handoff_s=handoff(p), handoff_blocks=HANDOFF_BLOCKS[engine], decode=False),
        HANDOFF_SOURCES[engine].cite(),
    )


__all__ = [
    "DISAGG_SOURCE",
    "HANDOFF_SOURCES",
    "VLLM_HANDOFF_SOURCE",
    "draft_state_bytes",
    "handoff",
    "handoff_bytes_per_rank",
    "kv_bytes_per_rank",
    "prefill_pool",
]
