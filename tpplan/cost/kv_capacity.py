"""KV capacity per rank as each engine version computes it, from the cost model's per-rank accounting.

The engine's formulas (how the pool's bytes follow from the card, the weights and its reserve; the
per-token cell; the running-request cap) are `tpplan.engines.memory`'s, each with its source. What
they are fed is the cost model's one accounting of memory per rank: the weights each PP stage holds
(`tpplan.audit.stage_weights`), the KV bytes per token of a layer (`Mixer.kv_bytes`, the figure
`Predictor.kv_per_token` uses) and the recurrent state per sequence (`Mixer.state_bytes`), and, for vLLM's
profiled activation peak, the predictor's activation estimate. `DIFFERENCES` says where that accounting
and the engine's measurement differ. docs/cost-model.md ("KV capacity") has the formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpplan.audit import stage_weights
from tpplan.cost.draft import DraftMemory
from tpplan.cost.plan_steps import STATE_BYTES
from tpplan.cost.predictor import Predictor
from tpplan.engines import ENGINES, kv_sizing, scheduler_rules, select, select_pair
from tpplan.engines.context_parallel import kv_cp_share
from tpplan.engines.memory import DIFFERENCES, MIB, KVCapacity, sglang_mamba_split, sglang_max_running, sglang_reserve
from tpplan.engines.schema import SglangMemory, VllmMemory
from tpplan.models.opkinds import mixer


def default_kv_engines() -> tuple[str, ...]:
    """The engines' default releases (`tpplan.engines.default_release`) whose KV sizing was read."""
    return tuple(ev.key for ev in select_pair(None) if ev.memory is not None)


DEFAULT_KV_ENGINES = default_kv_engines()  # at import


@dataclass(frozen=True)
class _Stage:
    """One PP stage's per-rank figures, from the cost model's accounting."""

    weights: float
    full: float  # KV bytes per token, full-attention layers
    windowed: float  # KV bytes per token, sliding-window / chunked layers
    window: int  # the smallest window of those layers (0: none)
    state: float  # recurrent state bytes per sequence


def _stages(p: Predictor, draft: DraftMemory | None = None, every_stage: bool = False) -> list[_Stage]:
    """Each stage's figures; `draft`: the speculative draft's weights on the last stage, and its layers' KV on
    the last stage (vLLM: the draft's own attention layers, `VLLM_DRAFT_MEMORY`) or, `every_stage`, on each
    at the target's last layer's cell (SGLang's configurator grows every rank's cell, `SGLANG_DRAFT_MEMORY`)."""
    spec, dep = p.graph.spec, p.deployment
    attn_tp = 1 if p.plan.dp_attention else p.tp  # DP attention: a rank keeps its own requests, every head
    share = kv_cp_share(dep)
    held = stage_weights(p.audit, p.graph, p.stages, p.kernels.stored)
    out = []
    for s, rng in enumerate(p.stages):
        full = windowed = state = 0.0
        windows = []
        last = s == len(p.stages) - 1
        drafts = draft.layers if draft is not None and (last or every_stage) else 0
        own = draft.attn if draft is not None and not every_stage else None  # vLLM caches the draft's own layers
        attns = [spec.layers[j].attn for j in rng] + [own or spec.layers[-1].attn] * drafts
        for attn in attns:  # SGLang: each draft layer at the target's (last) layer's cell
            mx = mixer(attn.kind)
            kv = mx.kv_bytes(attn, attn_tp, p.b) / share
            limit = getattr(attn, "window", None) or getattr(attn, "chunk", None)
            if limit:
                windowed += kv
                windows.append(int(limit))
            else:
                full += kv
            state += mx.state_bytes(attn, attn_tp, p.b, STATE_BYTES)
        weights = held[s].weights + (draft.weights if draft is not None and last else 0.0)
        out.append(_Stage(weights, full, windowed, min(windows, default=0), state))
    return out


def _attn_dp(p: Predictor) -> int:
    return p.tp if p.plan.dp_attention else 1


def _mla(p: Predictor) -> bool:
    return any(mixer(layer.attn.kind).latent_kv for layer in p.graph.spec.layers)


def sglang_capacity(
    p: Predictor, seq_len: int | None, key: str = "sglang@0.5.23", draft: DraftMemory | None = None
) -> KVCapacity:
    """SGLang (`key`, a version whose KV sizing was read) at its defaults: mem_fraction_static derived, pool =
    pre x fraction - weights (`draft`'s too, and its layers in every rank's cell)."""
    memory = kv_sizing(key)
    assert isinstance(memory, SglangMemory)
    card = p.topo.gpu.memory_GiB * 2**30
    kda = any(mixer(layer.attn.kind).channel_gated for layer in p.graph.spec.layers)  # uses_kda_attention
    chunk = scheduler_rules(key).budget.default_tokens(card / MIB / 1024)
    res = sglang_reserve(
        card / MIB, p.deployment, chunk=chunk, mla=_mla(p), dp_attention=bool(p.plan.dp_attention), kda=kda
    )
    pre = card  # free memory before loading; the CUDA context and NCCL are not counted (DIFFERENCES)
    best: tuple[int, int, int, float, _Stage] | None = None  # (tokens, swa tokens, slots, pool, stage)
    stages = _stages(p, draft, every_stage=True)
    kv_somewhere = any(st.full or st.windowed for st in stages)
    for st in stages:
        if kv_somewhere and not (st.full or st.windowed):
            continue  # its KV layers all on other PP stages: SGLang sizes its pool to int64 max (SGL_CELL)
        rest = pre * res.mem_fraction_static - st.weights
        slots = -1
        if st.state > 0:
            slots, rest = sglang_mamba_split(memory, rest, st.state)
        ratio = memory.swa_full_tokens_ratio
        cell = st.full + ratio * st.windowed if st.full and st.windowed else st.full or st.windowed
        tokens = max(0, math.floor(rest / cell)) if cell else 0
        swa = int(tokens * ratio) if st.full and st.windowed else tokens
        if best is None or tokens < best[0]:
            best = (tokens, swa, slots, max(rest, 0.0), st)
    assert best is not None
    tokens, swa, slots, pool, st = best
    attn_dp = _attn_dp(p)
    cap = sglang_max_running(tokens, None, p.deployment, dp_attention=bool(p.plan.dp_attention))
    bound = "max_running_requests"
    per_request = memory.mamba_slots_per_request
    if slots >= 0 and slots // per_request < cap:
        cap, bound = max(0, slots // per_request), "state slots"
    batch = None
    if seq_len is not None:
        fits = [tokens // seq_len] if st.full else []
        if st.windowed:
            fits.append(swa // min(seq_len, st.window))
        by_pool = min(fits) if fits else cap
        batch, bound = (by_pool, "KV pool") if by_pool < cap else (cap, bound)
        batch *= attn_dp
    settings = {"mem_fraction_static": res.mem_fraction_static, "chunked_prefill_size": res.chunked_prefill_size,
                "cuda_graph_max_bs": res.decode_max_bs, "reserved_mib": res.reserved_mib}  # fmt: skip
    return KVCapacity(
        key, card, st.weights, pre * (1 - res.mem_fraction_static),
        f"(1 - mem_fraction_static {res.mem_fraction_static}) of the card: activations {res.activations_mib:,.0f} MiB, "
        f"TP x PP {res.parallel_mib:,.0f} MiB, CUDA graphs {res.graphs_mib:,.0f} MiB"
        + (f", 10 GiB floor +{res.floor_mib:,.0f} MiB" if res.floor_mib else ""),
        pool, st.full or st.windowed, tokens, cap, seq_len, batch, bound if seq_len is not None else None,
        settings, tuple(f.source.cite() for f in memory.facts),
    )  # fmt: skip


def _vllm_sizing(p: Predictor, key: str, pd: bool) -> tuple[VllmMemory, str]:
    """The sizing a vLLM server of `key` runs on `p`'s cluster (a P/D server's connector may turn the extensible
    cache off: `VllmMemory.for_server`, the IMEX channel from the cluster file), and why, where it changed."""
    vm = kv_sizing(key)
    assert isinstance(vm, VllmMemory)
    stated = p.topo.imex_channel
    runs = vm.for_server(pd, bool(stated))
    if runs is vm or vm.pd_fabric is None:
        return vm, ""
    said = "imex_channel = false" if stated is False else "imex_channel not stated, taken as none"
    return runs, (f"; extensible KV cache off: a P/D server's {vm.pd_fabric.connector} shares the cache through "
                  f"NVLink fabric handles, which need an IMEX channel (cluster {p.topo.name}: {said})")  # fmt: skip


def vllm_capacity(
    p: Predictor, seq_len: int | None, key: str = "vllm@0.34.0", pd: bool = False, draft: DraftMemory | None = None
) -> KVCapacity:
    """vLLM (`key`, a version whose KV sizing was read) at its defaults: the profiled figures into its KV bytes,
    then blocks; `pd`: a P/D server's (its KV connector, NixlConnector, may change the sizing); `draft`: the
    MTP draft's weights and KV layers on the last stage (`VLLM_DRAFT_MEMORY`)."""
    vm, why = _vllm_sizing(p, key, pd)
    card = p.topo.gpu.memory_GiB * 2**30
    gib = p.topo.gpu.memory_GiB
    step = scheduler_rules(key).budget.default_tokens(gib, p.topo.gpu.name)
    peak = p.memory(None, step).activations  # tpplan's activation estimate at max_num_batched_tokens
    bs = vm.block_size
    cap = vm.max_num_seqs(gib, p.topo.gpu.name)
    best: tuple[int, int | None, float, _Stage] | None = None
    for st in _stages(p, draft):
        kv = vm.kv_bytes(card, st.weights, peak)
        per_token = st.full or st.windowed
        tokens = int(kv // (bs * per_token)) * bs if per_token else 0
        fit: int | None = None
        if seq_len is not None:
            blocks = math.ceil(seq_len / bs)
            need = blocks * bs * st.full + st.state
            if st.windowed:
                need += min(blocks, math.ceil(st.window / bs) + 1) * bs * st.windowed  # window - 1 + 1 in flight
            fit = int(kv // need) if need else cap
        if best is None or (fit if fit is not None else tokens) < (best[1] if best[1] is not None else best[0]):
            best = (tokens, fit, kv, st)
    assert best is not None
    tokens, fit, kv, st = best
    batch = bound = None
    if fit is not None:
        batch, bound = (fit, "KV pool") if fit < cap else (cap, "max_num_seqs")
        batch *= _attn_dp(p)
    settings = {"gpu_memory_utilization": vm.gpu_memory_utilization, "block_size": bs, "max_num_batched_tokens": step,
                "activation_peak_bytes": peak}  # fmt: skip
    return KVCapacity(
        key, card, st.weights, card - st.weights - kv, vm.reserve_text() + why, kv, st.full or st.windowed, tokens, cap,
        seq_len, batch, bound, settings, tuple(f.source.cite() for f in vm.facts),
    )  # fmt: skip


def kv_capacity(
    p: Predictor, engine: str, seq_len: int | None = None, pd: bool = False, draft: DraftMemory | None = None
) -> KVCapacity:
    """KV capacity per rank on `p`'s deployment as engine version `engine` computes it; `seq_len`: the
    decode batch the pool admits at that prompt + output length (None: none); `pd`: for a P/D server;
    `draft`: a speculative draft's weights and KV layers beside the target's (`tpplan.cost.draft`)."""
    memory = kv_sizing(engine)  # a TpplanError for a version whose sizing was not read
    key = select(engine).key
    if isinstance(memory, SglangMemory):
        return sglang_capacity(p, seq_len, key, draft)
    return vllm_capacity(p, seq_len, key, pd, draft)


def kv_engines_for(engine: str | None) -> tuple[str, ...]:
    """The engine versions to size the KV cache for: the one `engine` names where its sizing was read
    (`vllm`, `sglang@0.5.23`), else both default releases."""
    defaults = default_kv_engines()
    if engine:
        key = engine.strip().lower()
        if "@" not in key:
            key = next((d for d in defaults if d.startswith(f"{key}@")), key)
        if key in ENGINES and ENGINES[key].memory is not None:
            return (key,)
    return defaults


__all__ = ["DEFAULT_KV_ENGINES", "DIFFERENCES", "KVCapacity", "default_kv_engines", "kv_capacity", "kv_engines_for",
           "sglang_capacity", "vllm_capacity"]  # fmt: skip
