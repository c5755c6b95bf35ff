"""The named plans, and the repairs that turn an illegal plan into a legal one.

Each named plan is a small set of decisions (see `Plan`), applied model-wide; the propagation
specialises it per layer kind because patterns only match the ops a layer really has.
`gate-aware` is not hand-written per model: it is input-scattered, repaired by replicating the
column-parallel weights that would read token-sharded input and all-to-all'ing their outputs.
"""

from __future__ import annotations

import re
from typing import cast

from tpplan.engines.redundant_experts import REDUNDANT_PATTERN, with_redundant_experts
from tpplan.errors import TpplanError
from tpplan.layout.plan import OverlapName, Plan, baseline, with_ep, with_overlap
from tpplan.layout.propagate import propagate
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph, WeightSplit
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_COL, S_TOK, R
from tpplan.plans.files import is_plan_file, load_plan_file

# The MLA ops that produce the QKV latent (fused qkv_a with q_lora, kv_a without).
LATENT = frozenset({"*/mla.qkv_a", "*/mla.kv_a"})


def engine_notes(engine: str, mode: str) -> tuple[str, ...]:
    """One line per gate of an engine mode, from the engine data (`tpplan.engines`): the static
    conditions an audit lists beside legality, with their sources. Never hand-written prose."""
    from tpplan.engines import select

    m = select(engine).mode(mode)
    if m is None:
        return ()
    return tuple(f"{select(engine).key}: {g.text} (if not: {g.effect}; {g.source.cite()})" for g in m.gates)


def input_scattered() -> Plan:
    """tpplan's own input-scattered idea: both hidden norms on the rank's tokens (RS + AG around each
    block, the latent gathered instead of the attention input). No engine runs it: SGLang's
    --enable-attn-tp-input-scattered is `sglang-input-scattered`."""
    return Plan(
        "input-scattered",
        "input-scattered, both norms on local tokens",
        "Reduce-scatter the block output by token, norm on local tokens, token-local qkv_a, all-gather the "
        "QKV latent; the MLP input is all-gathered.",
        stream=S_TOK,
        gather=LATENT | {"*/layer.mlp_in"},
    )


def sglang_input_scattered() -> Plan:
    """SGLang's --enable-attn-tp-input-scattered as its code runs it (tpplan.engines.sglang): the
    layer input reduce-scattered, input_layernorm and qkv_a on local tokens, the QKV latent
    all-gathered, then one all-reduce of o_proj's partial sum with the rank's residual rows folded
    in; the post-attention norm and the MLP run on every row: RS(H) + AG(latent) + AR(H)."""
    return Plan(
        "sglang-input-scattered",
        "SGLang input-scattered",
        "Reduce-scatter the layer input by token, input norm and qkv_a on local tokens, all-gather the QKV "
        "latent; all-reduce o_proj's output with the residual rows folded in; post-attention norm and MLP on "
        "every row.",
        stream=S_TOK,
        gather=LATENT,
        fold=frozenset({"*/layer.mlp_add"}),
        engine_notes=engine_notes("sglang", "input-scattered"),
    )


def latent_scattered() -> Plan:
    return Plan(
        "latent-scattered",
        "latent token-sharding (prototype)",
        "Keep the hidden all-reduce; token-shard the replicated qkv_a GEMM and all-gather the latent.",
        gather=LATENT,
        token_shard=LATENT,
    )


def sequence_parallel() -> Plan:
    return Plan(
        "sequence-parallel",
        "Megatron sequence parallelism",
        "Reduce-scatter each block output by token, run the residual add and norm on local tokens, all-gather "
        "before each block.",
        stream=S_TOK,
        gather=frozenset({"*/layer.attn_in", "*/layer.mlp_in"}),
    )


SP_MOE_REPLICATED = frozenset({"*moe*/moe.shared_*", "*/moe.router", "*/moe.latent_*"})


def sp_moe(name: str = "sp-moe") -> Plan:
    """SP-MoE with the norms on the rank's rows: the normed attention input all-gathered, o_proj's
    output reduce-scattered, MoE on the rank's own rows with all-to-all dispatch/combine. On K3 this
    is SGLang's SGLANG_K3_SP_ATTN_RES=1 variant (bank on the rank's rows; it needs the fused SP
    collectives), on DeepSeek-V3 vLLM's MoE sequence parallelism; SGLang's default K3 path is
    `sglang-sp-moe`. `make_plan` also accepts its older name `moe-a2a` (see ALIASES)."""
    return Plan(
        name,
        "SP-MoE with all-to-all experts, norms on local tokens",
        "All-gather the normed input before attention, reduce-scatter after o_proj, MoE on local tokens with "
        "all-to-all dispatch/combine (DeepEP-style), shared experts replicated.",
        stream=S_TOK,
        reduce=S_TOK,
        gather=frozenset({"*/layer.attn_in", "*+dense/layer.mlp_in"}),
        replicate=SP_MOE_REPLICATED,
        moe="a2a",
        engine_notes=engine_notes("sglang", "sp-moe"),
    )


def sglang_sp_moe(attn_res: bool = True) -> Plan:
    """SGLang's K3 SP-MoE as it runs by default (`--moe-a2a-backend deepep|megamoe` with attention TP,
    SGLANG_K3_SP_ATTN_RES unset; tpplan.engines.sglang): the previous MoE layer's output is added on
    the rank's rows and the stream all-gathered (the FFN exit's `update_attn_tp_gather_output`), the
    attention-residual aggregation and input norm run on every row against a bank every rank holds
    whole (`bank=R`), o_proj's sum is reduce-scattered, and the post-attention aggregation, norm,
    router, latent projections, shared experts and the all-to-all MoE run on the rank's rows. Layers
    before the first MoE layer (and the first MoE layer's entry) keep the all-reduce path: the adds
    fold the stream shard into one all-reduce. `attn_res` False: the words for a model without K3's
    attention residuals (the same decisions; there is no bank and no aggregation to speak of)."""
    words = (
        "All-gather the stream after the MoE output add; attention-residual aggregation and input norm on "
        "every row; reduce-scatter o_proj's output; post-attention aggregation, norm and all-to-all MoE on local "
        "tokens; dense layers all-reduce."
        if attn_res
        else "All-gather the stream after the MoE output add; input norm on every row; reduce-scatter o_proj's "
        "output; post-attention norm and all-to-all MoE on local tokens; dense layers all-reduce."
    )
    title = "SGLang SP-MoE (default: bank on every row)" if attn_res else "SGLang-style SP-MoE (gather at MoE exit)"
    return Plan(
        "sglang-sp-moe",
        title,
        words,
        stream=S_TOK,
        reduce=S_TOK,
        bank=R,
        gather=frozenset({"*+moe/layer.attn_add"}),
        fold=frozenset({"*/layer.attn_add", "*+dense/layer.mlp_add"}),
        replicate=SP_MOE_REPLICATED,
        moe="a2a",
        engine_notes=engine_notes("sglang", "sp-moe"),
    )


def vllm_moe_chunk() -> Plan:
    """vLLM's MoE sequence parallelism for the models that chunk inside the MoE block (Qwen3-MoE:
    `Qwen3MoeSparseMoeBlock.forward`, tpplan.engines.vllm): attention stays Megatron TP (o_proj
    all-reduced, norms on every row); the MoE block takes the rank's chunk of the replicated hidden
    (`sequence_parallel_chunk`, a free slice), routes and dispatches it by all-to-all, and all-gathers
    its output back to every row before the next residual add."""
    return Plan(
        "vllm-moe-chunk",
        "vLLM MoE on the rank's chunk, output all-gathered",
        "All-reduce after o_proj; the MoE block takes the rank's chunk of the replicated hidden, routes and "
        "dispatches it by all-to-all, and all-gathers its output before the next residual add.",
        moe="a2a",
        gather=frozenset({"*/layer.delta"}),
        replicate=SP_MOE_REPLICATED,
        token_shard=frozenset({"*/moe.router", "*moe*/moe.shared_*"}),
    )


def repair(
    graph: ModelGraph, plan: Plan, n: int, how: str, name: str, title: str, summary: str, max_rounds: int = 12
) -> Plan:
    """Make `plan` legal on `graph` by adding the fixes the audit proposes, round by round.

    how="replicate": a column-parallel weight that reads token-sharded input is replicated and its
    output all-to-all'd to head-sharded (the gate-aware idea); how="gather": the input is
    all-gathered for that consumer only (the seed's "restore the hidden" variant).
    """
    current = plan
    for _ in range(max_rounds):
        changed = False
        for kind, lg in graph.kinds.items():
            res = propagate(lg, current, n)
            for v in res.violations:
                if v.consequence_of:
                    continue
                op = next(o for o in lg.ops if o.name == v.op)
                producer = next((o for o in lg.ops if o.output == v.value), None)
                prod_q = f"{kind}/{producer.role}" if producer else f"{kind}/layer.{v.value}"
                q = f"{kind}/{op.role}"
                if v.got is S_TOK and v.needs is S_COL:
                    current = current.with_(a2a=current.a2a | {prod_q})
                elif (
                    v.got is S_TOK
                    and v.needs is R
                    and how == "replicate"
                    and op_kind(op.kind).linear
                    and op.split is WeightSplit.COL
                ):
                    current = current.with_(replicate=current.replicate | {q})
                elif v.got in (S_TOK, S_COL) and v.needs is R:
                    current = current.with_(gather_for=current.gather_for | {(prod_q, q)})
                else:
                    continue
                changed = True
                break  # re-propagate this kind with the fix in place
        if not changed:
            break
    return current.with_(name=name, title=title, summary=summary, engine_notes=())


def gate_aware(graph: ModelGraph, n: int) -> Plan:
    return repair(
        graph,
        input_scattered(),
        n,
        "replicate",
        "gate-aware",
        "gate-aware scattered input",
        "Input-scattered, plus: every column-parallel projection that would read token-sharded hidden is "
        "replicated (runs on local tokens) and its output is all-to-all'd to head-sharded.",
    )


def restore_hidden(graph: ModelGraph, n: int) -> Plan:
    return repair(
        graph,
        input_scattered(),
        n,
        "gather",
        "input-scattered+restore",
        "input-scattered, hidden restored",
        "Input-scattered, plus an all-gather of the hidden for each op that needs every token of it.",
    )


NAMED_PLANS = ("baseline", "input-scattered", "latent-scattered", "sequence-parallel", "gate-aware")
EXTRA_PLANS = ("input-scattered+restore", "sp-moe", "sglang-input-scattered", "sglang-sp-moe", "vllm-moe-chunk")
ALL_PLANS = NAMED_PLANS + EXTRA_PLANS  # every plan make_plan builds by a fixed name
ALIASES = {"moe-a2a": "sp-moe"}  # accepted by make_plan, never printed: the plan comes back under its one name
# Parametrised families: "ep<k>" (baseline with EP<k> experts) and "<plan>+ep<k>".
EP_PATTERN = re.compile(r"(?:(?P<base>.+)\+)?ep(?P<ep>\d+)")
# "<plan>+tbo" / "<plan>+dbo": the plan under an engine's micro-batch overlap (tpplan.engines.overlap);
# "<plan>+asynctp": its GEMMs fused with their all-gathers / reduce-scatters (tpplan.engines.async_tp).
OVERLAP_PATTERN = re.compile(r"(?P<base>.+)\+(?P<overlap>tbo|dbo|asynctp)")


def overlapped(plan: Plan, overlap: OverlapName, graph: ModelGraph, n: int | None = None) -> Plan:
    """`plan` under the engine overlap `overlap`, refused where the engine does not run it for this model
    (`+asynctp`, which needs the TP size `n`: where the plan has nothing to fuse)."""
    if overlap == "asynctp":
        if n is None:
            raise TypeError("async TP needs the TP size")
        return async_tp(plan, graph, n)
    from tpplan.engines import overlap_named

    engine = overlap_named(overlap)
    why = engine.refusal(graph.spec.model_type)
    if why is not None:
        raise TpplanError(
            f"plan={plan.name}+{overlap}",
            f"{engine.engine} does not overlap micro-batches with {' '.join(engine.flags)}: {why}",
            "drop +tbo (or price vLLM's dual-batch overlap: +dbo)",
        )
    return with_overlap(plan, overlap)


def async_tp(plan: Plan, graph: ModelGraph, n: int) -> Plan:
    """`plan` with every all-gather feeding a GEMM and every GEMM feeding a reduce-scatter run as torch's
    fused symmetric-memory op (`tpplan.layout.fused_gemm`, priced by `tpplan.cost.async_tp`); refused, one
    line, where the plan has no such pair. Same collectives and bytes; the engine notes say how the fused
    ops move them and which engine flag runs it for this model."""
    from tpplan.engines.async_tp import ASYNC_TP, VERIFY_NOTE, VOLUME, launch_flags
    from tpplan.layout.fused_gemm import async_tp_refusal, model_pairs
    from tpplan.layout.propagate import propagate_model

    name = f"{plan.name}+asynctp"
    if plan.overlap is not None:
        raise TpplanError(f"plan={name}", f"plan {plan.name} already runs overlap {plan.overlap}; a plan takes one",
                          f"use {plan.name} or {plan.name.rsplit('+', 1)[0]}+asynctp")  # fmt: skip
    results = propagate_model(graph, plan, n).results
    why = async_tp_refusal(plan, n, results)
    if why is not None:
        raise TpplanError(f"plan={name} (tp={n})", f"async TP fuses collectives into GEMMs, and {why}",
                          "decorate a sequence-parallel plan, e.g. sequence-parallel+asynctp")  # fmt: skip
    pairs = [p for layer in model_pairs(results) for p in layer]
    ag = sum(p.pattern == "ag_gemm" for p in pairs)
    flags = launch_flags(graph.spec.model_type)
    engines = "; ".join(f"{e}: {' '.join(f) if isinstance(f, tuple) else 'none: ' + f}" for e, f in flags.items())
    return plan.with_(
        name=name,
        title=f"{plan.title}, async TP",
        summary=f"{plan.summary} Async TP: each all-gather into a GEMM and each GEMM into a reduce-scatter runs as "
        "one op, in TP chunks, each chunk's peer copy under another chunk's GEMM.",
        overlap="asynctp",
        engine_notes=(
            *plan.engine_notes,
            f"async TP fuses {ag} all-gather -> GEMM and {len(pairs) - ag} GEMM -> reduce-scatter pairs per forward "
            f"({ASYNC_TP.engine} calls torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter); "
            f"volume: {VOLUME}",
            f"engine flags for {graph.spec.model_type}: {engines}",
        ),
        notes=(*plan.notes, VERIFY_NOTE),
    )


def plan_name(name: str) -> str:
    """The one printed name of a plan the user may have named by an alias (`moe-a2a` -> `sp-moe`)."""
    return ALIASES.get(name, name)


def ffn_words(graph: ModelGraph) -> str:
    """The feed-forward blocks `graph` has, as a plan's words name them: "MLP", "MoE" or "MLP/MoE"."""
    kinds = {layer.mlp.kind for layer in graph.spec.layers}
    return "MLP/MoE" if len(kinds) > 1 else "MoE" if "moe" in kinds else "MLP"


def in_model_words(plan: Plan, graph: ModelGraph) -> Plan:
    """`plan` with its summary naming only the feed-forward blocks the model has (a dense model's
    baseline all-reduces "after the MLP", not "after the MLP/MoE")."""
    words = ffn_words(graph)
    return plan if words == "MLP/MoE" else plan.with_(summary=plan.summary.replace("MLP/MoE", words))


def make_plan(name: str, graph: ModelGraph, n: int) -> Plan:
    """The plan a `--plan` value names, for this model and TP size: a named plan (an alias builds it
    under its one name), `ep<k>`, `<plan>+ep<k>`, `<plan>+redundant<r>` (r redundant experts over its EP
    group, `tpplan.engines.redundant_experts`), or a plan file (`*.json`, written by
    `tpplan search --save`; see `tpplan.plans.files`). Every command resolves `--plan` here."""
    if is_plan_file(name):
        return load_plan_file(name, graph, n)
    name = plan_name(name)
    redundant = REDUNDANT_PATTERN.fullmatch(name)
    if redundant:
        return with_redundant_experts(make_plan(redundant["base"], graph, n), int(redundant["count"]))
    over = OVERLAP_PATTERN.fullmatch(name)
    if over:
        mode = cast(OverlapName, over["overlap"])  # the pattern admits only the OverlapName values
        return overlapped(make_plan(over["base"], graph, n), mode, graph, n)
    ep = EP_PATTERN.fullmatch(name)
    if ep:
        base = make_plan(ep["base"] or "baseline", graph, n)
        if base.moe != "tp":
            raise TpplanError(f"plan={name}", f"plan {base.name} already uses MoE mode {base.moe}", "use ep<k> alone")
        if not graph.has_routed_experts:
            raise TpplanError(
                f"plan={name}", f"{graph.spec.name} has no routed experts to spread", f"use {base.name} alone"
            )
        return with_ep(base, Mesh(n, ep=int(ep["ep"])))
    simple = {
        "baseline": baseline,
        "input-scattered": input_scattered,
        "latent-scattered": latent_scattered,
        "sequence-parallel": sequence_parallel,
        "sp-moe": sp_moe,
        "sglang-input-scattered": sglang_input_scattered,
        "vllm-moe-chunk": vllm_moe_chunk,
    }
    if name == "sglang-sp-moe":
        return sglang_sp_moe(attn_res=bool(graph.spec.attn_res_block_size))
    if name in simple:
        return in_model_words(simple[name](), graph)
    if name == "gate-aware":
        return gate_aware(graph, n)
    if name == "input-scattered+restore":
        return restore_hidden(graph, n)
    dp = make_dp_plan(name, graph, n)
    if dp is not None:
        return dp
    raise _unknown_plan(name)


def _unknown_plan(name: str) -> TpplanError:
    """A mistyped plan gets "did you mean" (difflib, as preset names do); only a name close to none
    gets the whole list of forms."""
    import difflib

    known = list(ALL_PLANS + DP_PLANS + tuple(ALIASES))
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.6)
    forms = (
        "ep<k> or <plan>+ep<k> (expert parallelism), <plan>+redundant<r> (redundant experts), <plan>+tbo or "
        "<plan>+dbo (micro-batch overlap), <plan>+asynctp (GEMM + collective fusion), or a plan file (*.json) "
        "from `tpplan search --save DIR`"
    )
    if close:
        more = f" (or {', '.join(close[1:])})" if len(close) > 1 else ""
        return TpplanError(f"plan={name}", "unknown plan", f"did you mean {close[0]}?{more}")
    return TpplanError(f"plan={name}", "unknown plan", f"choose one of {', '.join(ALL_PLANS + DP_PLANS)}, {forms}")


__all__ = [
    "ALIASES",
    "ALL_PLANS",
    "EP_PATTERN",
    "EXTRA_PLANS",
    "NAMED_PLANS",
    "OVERLAP_PATTERN",
    "S_COL",
    "engine_notes",
    "make_plan",
    "plan_name",
    "repair",
    "sglang_input_scattered",
    "sglang_sp_moe",
    "sp_moe",
    "vllm_moe_chunk",
    "with_ep",
]


# ----------------------------------------------------------------------------------------------
# DP attention (docs/design.md, "DP attention"; `tpplan.layout.dp_attention`). Each rank runs
# attention on its own requests with whole attention weights; the MLP/MoE side gathers every
# rank's tokens and scatters back. The attention-side weights are found per graph, so these plans
# take the graph like gate-aware does.

DP_PLANS = ("dp-attention", "dp-attention-maxlen", "dp-attention+a2a", "vllm-dp-ep", "vllm-dp")

SGLANG_DP_NOTE = (
    "SGLang: --enable-dp-attention --dp-size N (attention TP = tp/dp = 1); extend batches over more than one DP "
    "rank use DpPaddingMode.SUM_LEN (dp_attention.py get_dp_padding_mode): the gather all-reduces a zero-filled "
    "buffer of every rank's rows and the MoE all-reduces before dp_scatter"
)

SGLANG_DP_MAXLEN_NOTE = (
    "SGLang pads to the longest DP rank (DpPaddingMode.MAX_LEN: all_gather_into_tensor, then "
    "dp_reduce_scatter_tensor) for extend batches only with the pplx all-to-all backend, "
    "SGLANG_DEEPEP_V2_FORCE_MAX_LEN, or a hybrid-SSM model with an idle rank; other prefill batches use SUM_LEN"
)


def _attention_linears(graph: ModelGraph) -> frozenset[str]:
    """Qualified roles of every attention-side linear (they are replicated under DP attention)."""
    return frozenset(
        f"{kind}/{op.role}"
        for kind, lg in graph.kinds.items()
        for op in lg.ops
        if op_kind(op.kind).linear and lg.region_of(op) == "attn_side"
    )


def _mlp_side_linears(graph: ModelGraph) -> frozenset[str]:
    return frozenset(
        f"{kind}/{op.role}"
        for kind, lg in graph.kinds.items()
        for op in lg.ops
        if op_kind(op.kind).replicable and lg.region_of(op) == "mlp_side"
    )


def _experts_inputs(graph: ModelGraph) -> frozenset[tuple[str, str]]:
    """(producer, routed experts) for every input of every routed-experts op: the hidden (or K3's
    latent) and the routing, gathered for the experts only."""
    out = set()
    for kind, lg in graph.kinds.items():
        producer = {op.output: op for op in lg.ops}
        for op in lg.ops:
            if op_kind(op.kind).routed_experts:
                for v in op.inputs:
                    src = f"{kind}/{producer[v].role}" if v in producer else f"{kind}/layer.{v}"
                    out.add((src, f"{kind}/{op.role}"))
    return frozenset(out)


def dp_attention(graph: ModelGraph, padding: str = "sum_len") -> Plan:
    """SGLang `--enable-dp-attention` with TP MoE: attention replicated on each rank's own requests,
    the normed MLP input gathered, the MLP/MoE under TP, its output reduced into the rank's rows."""
    name = "dp-attention" if padding == "sum_len" else "dp-attention-maxlen"
    how = (
        "all-reduce of a zero-filled buffer of every rank's rows (SUM_LEN), MoE output all-reduced and sliced"
        if padding == "sum_len"
        else "all-gather of buffers padded to the longest rank (MAX_LEN), MoE output reduce-scattered"
    )
    return Plan(
        name,
        f"DP attention ({'SUM_LEN' if padding == 'sum_len' else 'MAX_LEN'})",
        f"Each rank runs attention with whole weights on its own requests; the MLP input is gathered by {how}.",
        stream=S_TOK,
        gather=frozenset({"*/layer.mlp_in"}),
        replicate=_attention_linears(graph),
        dp_attention="sum_len" if padding == "sum_len" else "max_len",
        engine_notes=(SGLANG_DP_NOTE if padding == "sum_len" else SGLANG_DP_MAXLEN_NOTE,),
    )


def dp_attention_a2a(graph: ModelGraph) -> Plan:
    """SGLang `--enable-dp-attention --moe-a2a-backend deepep`: MoE layers dispatch each rank's own
    tokens by all-to-all (router and shared experts on local tokens); dense layers stay TP on the
    gathered tokens (SUM_LEN gather)."""
    return Plan(
        "dp-attention+a2a",
        "DP attention, all-to-all experts",
        "Attention on each rank's own requests; MoE by all-to-all dispatch/combine of the rank's tokens (shared "
        "experts and router replicated); dense MLPs all-reduce-gathered (SUM_LEN) under TP.",
        stream=S_TOK,
        gather=frozenset({"*+dense/layer.mlp_in"}),
        replicate=_attention_linears(graph) | {"*moe*/moe.shared_*", "*/moe.router", "*/moe.latent_*"},
        moe="a2a",
        dp_attention="sum_len",
        engine_notes=(
            "SGLang: --enable-dp-attention --dp-size N --moe-a2a-backend deepep; dense layers keep the FULL MLP "
            "mode (all-reduce gather) unless --moe-dense-tp-size 1",
        ),
    )


def vllm_dp_ep(graph: ModelGraph, n: int, expert_parallel: bool = True) -> Plan:
    """vLLM `--data-parallel-size N --enable-expert-parallel` (TP 1 per DP rank) with the default
    all-gather/reduce-scatter all2all backend (`AgRsAll2AllManager`): every weight but the routed
    experts is replicated and runs on the rank's own tokens; the MoE input and the routing are
    all-gathered for the experts (E/N per rank), their output reduce-scattered back. Without
    `--enable-expert-parallel` (`vllm-dp`) the routed experts are split by TP over the N ranks
    instead (`FusedMoEParallelConfig.make` flattens TP across DP), gathered the same way."""
    if not expert_parallel:
        return vllm_dp_ep(graph, n).with_(
            name="vllm-dp",
            title="vLLM DP (routed experts TP over the DP ranks)",
            summary="Every rank runs everything but the routed experts on its own requests; the routed experts, "
            "split by TP over the N ranks, see every rank's tokens by all-gather and return a reduce-scatter.",
            moe="tp",
            ep_size=None,
            engine_notes=("vLLM: --data-parallel-size N (TP 1, no --enable-expert-parallel)",),
        )
    return Plan(
        "vllm-dp-ep",
        "vLLM DP + EP (all-gather / reduce-scatter dispatch)",
        "Every rank runs attention, dense MLPs, shared experts and the router on its own requests; the routed "
        "experts (E/N per rank) see every rank's tokens by all-gather and return a reduce-scatter.",
        stream=S_TOK,
        reduce=S_TOK,
        gather_for=_experts_inputs(graph),
        replicate=_attention_linears(graph) | _mlp_side_linears(graph),
        moe="ep",
        ep_size=n,
        dp_attention="max_len",
        engine_notes=(
            "vLLM: --data-parallel-size N --enable-expert-parallel (TP 1); all_gatherv/reduce_scatterv move each "
            "rank's exact token count, equal to tpplan's padded buffers when the ranks are balanced",
        ),
    )


def make_dp_plan(name: str, graph: ModelGraph, n: int) -> Plan | None:
    """The DP-attention plan `name` names, or None when it names none."""
    if name == "dp-attention":
        return dp_attention(graph)
    if name == "dp-attention-maxlen":
        return dp_attention(graph, "max_len")
    if name == "dp-attention+a2a":
        return dp_attention_a2a(graph)
    if name == "vllm-dp-ep":
        return vllm_dp_ep(graph, n)
    if name == "vllm-dp":
        return vllm_dp_ep(graph, n, expert_parallel=False)
    return None
