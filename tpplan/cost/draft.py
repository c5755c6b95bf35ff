"""The draft of speculative decoding as the engines load and run it (`tpplan.engines.speculative`, where the
rules are read): its weights per rank and its KV layers, which come out of the KV pool
(`tpplan.cost.kv_capacity`), and its seconds per decode step on the last stage, through the target's own
pricers: a draft layer's lowered program (`Predictor.kind_time`), the GEMM pricer (`KernelPricer.gemm_seconds`)
and the collective pricer (`price_collective`). No second cost path: an MTP draft's decoder layer is the
target's last layer; an EAGLE draft whose config tpplan can read (a preset, a config.json or a checkpoint
folder as DRAFT) is its own graph, lowered and priced at the target's TP by the same predictor class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpplan.audit import layer_weight_bytes
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.segments import Segments
from tpplan.engines.speculative import Speculative, draft_over_whole_step, prefill_draft_samples
from tpplan.errors import TpplanError
from tpplan.layout.propagate import LayerResult
from tpplan.mesh import Mesh
from tpplan.models.config import list_presets, load_config_dict, load_model
from tpplan.models.graph import build_model_graph
from tpplan.models.spec import AttnSpec, ModelSpec
from tpplan.plans.named import make_plan

NORMS = 3  # a nextn layer's enorm, hnorm and shared_head.norm, one hidden-wide weight each
EAGLE3_AUX = 3  # EAGLE-3's fc reads this many target hidden states unless its config says (both engines' default)


@dataclass(frozen=True)
class DraftMemory:
    """The draft on one rank: `layers` decoder layers of `layer_bytes` each (MTP: the config's
    num_nextn_predict_layers, each the target's last layer sharded as the target's; EAGLE: its checkpoint's
    layers at the target's TP), `glue_bytes` of unsharded projections and norms (MTP's eh_proj per layer,
    EAGLE's fc) and `head_bytes` of an lm_head of its own (EAGLE-3's draft vocabulary; else the target's,
    shared, as is the embedding). `attn`: the attention a draft layer caches as vLLM sizes it (EAGLE: the
    draft's own; None: the target's last layer's; SGLang takes the target's per-layer cell either way).
    `hidden`: the draft's hidden width (SGLang's spec_hidden_size: the hidden state it carries per request)."""

    layers: int
    layer_bytes: float
    glue_bytes: float
    head_bytes: float = 0.0
    attn: AttnSpec | None = None
    hidden: int = 0

    @property
    def weights(self) -> float:
        """The draft's weight bytes on one rank."""
        return self.layers * self.layer_bytes + self.glue_bytes + self.head_bytes

    def to_json(self) -> dict[str, object]:
        return {"layers": self.layers, "weights_bytes_per_rank": self.weights}


@dataclass(frozen=True)
class DraftPass:
    """What one draft pass runs: `layers` of `predictor`'s (the target's for MTP, the EAGLE draft's own
    graph's), an unsharded `fc_in` -> `hidden` projection over the pass's tokens and a vocab-parallel lm_head
    of `head_vocab` rows over one token per request; `memory`: None where the draft's config is not read."""

    predictor: Predictor
    layers: tuple[LayerResult, ...]
    fc_in: int
    hidden: int
    head_vocab: int
    memory: DraftMemory | None


def eagle_config(spec: Speculative) -> dict[str, object] | None:
    """The EAGLE draft's config where DRAFT names one tpplan can read (a preset, a config.json, a checkpoint
    folder); None for a hub name (tpplan reads no hub). A DRAFT written as a local path that is not there is
    refused, not taken for a hub name; a config that cannot be read is refused naming DRAFT."""
    name = spec.draft_model
    if spec.method != "eagle" or name is None:
        return None
    where = f"spec_draft={name}"
    if name not in list_presets() and not Path(name).exists():
        if _local_path(name):
            raise TpplanError(where, "no such file or folder", "give an existing config.json or checkpoint folder")
        return None
    if Path(name).is_dir() and not (Path(name) / "config.json").exists():
        raise TpplanError(where, "is a folder without config.json", "give the draft checkpoint's folder")
    try:
        return load_config_dict(name)[0]
    except TpplanError as err:
        raise _as_draft(err, name) from None


def eagle3_draft(spec: Speculative) -> bool:
    """Whether the EAGLE draft is an EAGLE-3 one: its config's architecture says so, or, for a hub name tpplan does
    not read, the name does (vLLM 0.34.0's own test, v1/worker/gpu/spec_decode/eagle/config.py
    Eagle3SpeculatorConfig.matches: "eagle3" in the draft's name)."""
    if spec.method != "eagle" or spec.draft_model is None:
        return False
    raw = eagle_config(spec)
    return _is_eagle3(raw) if raw is not None else "eagle3" in spec.draft_model.lower()


def _is_eagle3(raw: dict[str, object]) -> bool:
    return "eagle3" in str(raw.get("architectures", "")).lower()


def _local_path(name: str) -> bool:
    """Whether DRAFT is written as a local path, not a hub name (`org/name`): absolute or relative to `.`
    or `~`, a .json file, more than one `/` or ending in one."""
    return name.startswith(("/", ".", "~")) or name.endswith((".json", "/")) or name.count("/") > 1


def _as_draft(err: TpplanError, name: str) -> TpplanError:
    """`err` from reading or planning the draft, naming DRAFT (the library names the file it read)."""
    if err.where.startswith(f"spec_draft={name}"):
        return err
    detail = err.where.removeprefix(name).removeprefix("/config.json").removeprefix(":").strip()
    return TpplanError(f"spec_draft={name}", f"{detail}: {err.reason}" if detail else err.reason, err.fix)


def check_draft_fits(raw: dict[str, object], draft: ModelSpec, target: ModelSpec, name: str) -> None:
    """The EAGLE draft reads the target's hidden states (its fc, `target_hidden_size`, else its own hidden)
    and shares the target's embedding and tokens (vocab_size): both must be the target's."""
    hidden = _int(raw, "target_hidden_size", draft.hidden)
    for what, got, want in (("target hidden size", hidden, target.hidden), ("vocab_size", draft.vocab, target.vocab)):
        if got != want:
            raise TpplanError(f"spec_draft={name}", f"its {what} is {got}, the target {target.name}'s is {want}",
                              f"give a draft trained for {target.name}")  # fmt: skip


def check_draft(spec: Speculative, target: ModelSpec) -> None:
    """What `spec` asks of `target`, checked once before any deployment is priced (a search under targets
    would count a bad draft as every deployment skipped): MTP's nextn layers; an EAGLE draft's config
    readable and this target's (`check_draft_fits`)."""
    spec.check_model(target)
    raw = eagle_config(spec)
    if raw is None or spec.draft_model is None:
        return
    try:
        check_draft_fits(raw, load_model(spec.draft_model), target, spec.draft_model)
    except TpplanError as err:
        raise _as_draft(err, spec.draft_model) from None


def draft_pass(p: Predictor, spec: Speculative) -> DraftPass:
    """The draft pass of `spec` on `p`'s deployment (`DraftPass`)."""
    model = p.graph.spec
    raw = eagle_config(spec)
    if raw is None:  # MTP, or an EAGLE draft whose config is not read: timed as the target's last layer
        if spec.method == "mtp":
            spec.check_model(model)
        layers = (p.audit.layer_results[-1],) * spec.draft_layers
        memory = mtp_memory(p) if spec.method == "mtp" else None
        return DraftPass(p, layers, 2 * model.hidden, model.hidden, model.vocab, memory)
    assert spec.draft_model is not None
    try:
        graph = build_model_graph(load_model(spec.draft_model))
        check_draft_fits(raw, graph.spec, model, spec.draft_model)
        d = cached_predictor(graph, make_plan("baseline", graph, p.tp), p.topo, Mesh(p.tp), p.dtype, None)
    except TpplanError as err:
        raise _as_draft(err, spec.draft_model) from None
    eagle3 = _is_eagle3(raw)
    fc_in = (_int(raw, "num_aux_hidden_states", EAGLE3_AUX) if eagle3 else 2) * _int(raw, "target_hidden_size",
                                                                                      model.hidden)  # fmt: skip
    vocab = _int(raw, "draft_vocab_size", model.vocab)
    own_head = eagle3 and vocab != model.vocab  # a draft vocabulary: its own head (else the target's, shared)
    b = d.kernels.stored.dtype_bytes
    per_layer = [layer_weight_bytes(r, d.kernels.stored, d.audit.n) for r in d.audit.layer_results]
    head = vocab * graph.spec.hidden / p.tp * b if own_head else 0.0
    memory = DraftMemory(len(per_layer), sum(per_layer) / len(per_layer), fc_in * graph.spec.hidden * b, head,
                         graph.spec.layers[0].attn, graph.spec.hidden)  # fmt: skip
    return DraftPass(d, tuple(d.audit.layer_results), fc_in, graph.spec.hidden, vocab, memory)


def _int(raw: dict[str, object], key: str, default: int) -> int:
    """A positive whole number the draft's config gives for `key`, else `default`."""
    value = raw.get(key)
    return value if isinstance(value, int) and value > 0 else default


def mtp_memory(p: Predictor) -> DraftMemory:
    """The MTP draft's memory: its nextn layers, each the target's last layer with an eh_proj and norms."""
    model = p.graph.spec
    stored = p.kernels.stored
    layer = layer_weight_bytes(p.audit.layer_results[-1], stored, p.audit.n)
    glue = (2 * model.hidden * model.hidden + NORMS * model.hidden) * stored.dtype_bytes  # eh_proj: 2H -> H
    return DraftMemory(model.mtp_layers, layer, model.mtp_layers * glue, hidden=model.hidden)


def draft_memory(p: Predictor, spec: Speculative | None) -> DraftMemory | None:
    """The draft's memory on `p`'s deployment; None without speculative decoding, and for an EAGLE draft
    whose config tpplan does not read (`EAGLE_NOT_MODELLED`)."""
    if spec is None:
        return None
    return draft_pass(p, spec).memory


def draft_rows(p: Predictor, tokens: int) -> int:
    """The rows a rank's replicated GEMM (eh_proj, fc) runs for `tokens` of the replica: DP attention spreads
    the requests over the ranks, each running its own; TP runs every token on every rank."""
    return -(-tokens // p.tp) if p.plan.dp_attention else tokens


def draft_pass_extras(p: Predictor, requests: int, tokens: int, one: DraftPass) -> float:
    """Seconds of one draft pass beside its decoder layers, for `requests` requests of `tokens` tokens in all:
    the projection into the draft (eh_proj or fc, `fc_in` -> hidden, every rank whole) over the pass's tokens,
    and the lm_head (vocab-parallel over TP) over one token per request, with the logits' all-gather over TP."""
    h, fc_in, head_vocab = one.hidden, one.fc_in, one.head_vocab
    fc = p.kernels.gemm_seconds(draft_rows(p, tokens), fc_in, h)
    head = p.kernels.gemm_seconds(requests, h, -(-head_vocab // p.tp))
    gather = 0.0
    if p.tp > 1:
        est = price_collective("all_gather", requests * head_vocab * p.b, p.tp, p.topo, ranks_per_node=p.rpn,
                               sources=p.comms.sources)  # fmt: skip
        gather = est.time_s
    return fc + head + gather


def segments_pass_seconds(p: Predictor, one: DraftPass, segs: Segments, sample: bool = True) -> float:
    """One draft pass over `segs` ((tokens, context) per request): its layers and extras (`sample` False: no
    lm_head, a pass that only fills the draft's KV)."""
    layers = sum(one.predictor.kind_time(r, segs).total_s for r in one.layers)
    tokens = sum(n for n, _ in segs)
    if not sample:
        return layers + p.kernels.gemm_seconds(draft_rows(p, tokens), one.fc_in, one.hidden)
    return layers + draft_pass_extras(p, len(segs), tokens, one)


def pass_seconds(p: Predictor, one: DraftPass, batch: int, width: int, context: int) -> float:
    """One draft pass of `batch` requests of `width` tokens at `context`: its layers and extras."""
    return segments_pass_seconds(p, one, ((width, context),) * batch)


def prefill_draft_seconds(p: Predictor, spec: Speculative, segs: Segments, one: DraftPass | None = None) -> float:
    """The draft a P/D prefill server of a speculative decode pool runs on the last stage per step of `segs`
    (`tpplan.engines.speculative.PD_PREFILL_SOURCES`): one pass over the step's tokens (SGLang's draft extend,
    with its lm_head for the decode server's first draft; vLLM's draft prefill, which only fills the draft's KV,
    `prefill_draft_samples`)."""
    one = one if one is not None else draft_pass(p, spec)
    return segments_pass_seconds(p, one, segs, sample=prefill_draft_samples(p.pipeline.engine))


def propose_seconds(
    p: Predictor, spec: Speculative, one: DraftPass, segs: Segments, contexts: tuple[int, ...]
) -> float:
    """A draft's proposal of k tokens: one pass over `segs` sampling one token per request, then k - 1
    one-token passes, one per request at `contexts`."""
    wide = segments_pass_seconds(p, one, segs)
    if spec.draft_tokens == 1:
        return wide
    return wide + (spec.draft_tokens - 1) * segments_pass_seconds(p, one, tuple((1, c) for c in contexts))


def draft_step_seconds(
    p: Predictor, spec: Speculative, batch: int, context: int, one: DraftPass | None = None
) -> float:
    """A speculative step's draft on the last stage: one pass over the verify width per request (SGLang's
    draft extend, vLLM's draft prefill) and k - 1 one-token passes (`one`: the pass, `draft_pass` by default)."""
    one = one if one is not None else draft_pass(p, spec)
    return propose_seconds(p, spec, one, ((spec.verify_tokens, context),) * batch, (context,) * batch)


def aggregated_draft_seconds(
    p: Predictor, spec: Speculative, prefill: Segments, decode: Segments, samples: bool, one: DraftPass | None = None
) -> float:
    """The draft an aggregated server runs on the last stage in a step of `prefill` chunks and `decode`
    requests' verify segments (`tpplan.engines.speculative.AGG_PREFILL_SOURCES`). SGLang: a prefill step runs
    one draft extend over its chunks' tokens, every chunk, with the lm_head over one token per request; a
    decode step's draft as `draft_step_seconds`. vLLM: one draft prefill over every token of the step; where a
    request of the step will verify drafts (`samples`: a decode request, or a prompt's final chunk with tokens
    to decode) the lm_head over one token per request and k - 1 one-token passes over every request of the
    step; else the pass only fills the draft's KV."""
    one = one if one is not None else draft_pass(p, spec)
    ctx = tuple(c + n for n, c in prefill) + tuple(c for _, c in decode)
    if draft_over_whole_step(p.pipeline.engine):
        if not samples:
            return segments_pass_seconds(p, one, prefill + decode, sample=False)
        return propose_seconds(p, spec, one, prefill + decode, ctx)
    out = segments_pass_seconds(p, one, prefill) if prefill else 0.0
    return out + (propose_seconds(p, spec, one, decode, ctx[len(prefill) :]) if decode else 0.0)


__all__ = ["DraftMemory", "DraftPass", "aggregated_draft_seconds", "check_draft", "draft_memory", "draft_pass",
           "draft_pass_extras", "draft_rows", "draft_step_seconds", "eagle_config", "mtp_memory", "pass_seconds",
           "prefill_draft_seconds", "propose_seconds", "segments_pass_seconds"]  # fmt: skip
