"""DP attention (`tpplan.layout.dp_attention`, docs/design.md "DP attention"): the plans' collectives
as the engines issue them, their prediction, and execution on gloo equal to the unsharded model
(each DP rank's request run on its own) and to transformers.

Fast tests check the planner; the `slow` ones spawn 2 or 4 gloo ranks with a handful of tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

from tpplan.audit import audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.dp_attention import DP_TRANSITIONS, priced_tokens, rank_tokens
from tpplan.lower.schedule import predict_schedule
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import OpKind, build_model_graph
from tpplan.placement import S_TOK
from tpplan.plans.named import DP_PLANS, make_plan
from tpplan.runtime.transitions import RUNTIME_DP_TRANSITIONS
from tpplan.runtime.verify import CaseResult, VerifyCase, verify_cases

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _graph(model: str):
    return build_model_graph(load_model(model))


def _labels(pa, kind: str) -> list[str]:
    return [f"{c.collective.short}({c.value} {c.width})" for c in pa.kinds[kind].result.comms]


def test_sum_len_gathers_and_scatters_by_all_reduce_max_len_by_all_gather_and_reduce_scatter() -> None:
    """SGLang's two paddings on a DeepSeek MoE layer: SUM_LEN = AR(delta) + AR(mlp input), MAX_LEN =
    RS(delta) + AG(mlp input); attention issues nothing (whole weights, own tokens)."""
    g = _graph("tiny-deepseek-v3")
    h = g.hidden
    sum_len = audit_plan(g, make_plan("dp-attention", g, 2), 2)
    max_len = audit_plan(g, make_plan("dp-attention-maxlen", g, 2), 2)
    assert sum_len.legal and max_len.legal
    mlp_in = g.kinds["mla+moe"].ops[[o.role for o in g.kinds["mla+moe"].ops].index("layer.mlp_in")].output
    assert _labels(sum_len, "mla+moe") == [f"AR(delta {h})", f"AR({mlp_in} {h})"]
    assert _labels(max_len, "mla+moe") == [f"RS(delta {h})", f"AG({mlp_in} {h})"]
    for pa in (sum_len, max_len):
        res = pa.kinds["mla+moe"].result
        assert all(c.region == "mlp_side" or c.value == "delta" for c in res.comms)
        for d in res.decisions:
            if d.op.kind is OpKind.TOKEN_MIX:
                assert d.strategy.output is S_TOK and d.compute_share == 1 / 2  # own tokens, no redundancy
            if d.op.kind is OpKind.LINEAR and g.kinds["mla+moe"].region_of(d.op) == "attn_side":
                assert d.weight_elements_per_rank == d.op.weight_numel  # whole attention weights
    # The embedding is looked up locally (no reduction of it into the first layer's stream).
    assert _labels(sum_len, "mla+dense") == [f"AR({mlp_in} {h})"]


def test_without_dp_a_token_mixer_refuses_token_sharded_input() -> None:
    """The new strategy exists only under `dp_attention`: the same decisions without it are illegal
    (a token-sharded slice of one sequence cannot be attended on its own)."""
    g = _graph("tiny-qwen3")
    plan = make_plan("dp-attention", g, 2).with_(dp_attention=None)
    pa = audit_plan(g, plan, 2)
    assert not pa.legal and any(v.op == "attention" for v in pa.violations)


def test_schedule_shapes_and_no_fallback_for_tiny_chunks() -> None:
    """SUM_LEN all-reduces the [T, H] buffer of every rank's rows; MAX_LEN gathers N*ceil(T/N) rows;
    a chunk with fewer tokens than ranks is padded (idle ranks), never run as the baseline."""
    g = _graph("tiny-deepseek-v3")
    h, n, t = g.hidden, 4, 7
    for name, kind, shape in (("dp-attention", "all_reduce", (t, h)), ("dp-attention-maxlen", "all_gather", (8, h))):
        plan = make_plan(name, g, n)
        calls = [c for s in predict_schedule(g, plan, n, t, rank=1) for c in s.calls]
        gathers = [c for c in calls if c.layer == 1 and c.kind == kind and c.value != "delta"]
        assert [c.shape for c in gathers] == [shape], name
        sched = predict_schedule(g, plan, n, 9, chunk=3, rank=0)  # chunks of 3 tokens on 4 ranks
        assert not any(s.fallback for s in sched)


def test_dp_transitions_have_runtime_calls_and_the_padding_assumption() -> None:
    assert RUNTIME_DP_TRANSITIONS.keys() == DP_TRANSITIONS.keys()
    assert rank_tokens(11, 4) == [3, 3, 3, 2]
    assert rank_tokens(2, 4) == [1, 1, 0, 0]
    assert priced_tokens([5, 1, 1, 1], "max_len") == 20  # every rank padded to the longest
    assert priced_tokens([5, 1, 1, 1], "sum_len") == 8


def test_dp_memory_prices_whole_attention_weights_and_embedding_and_own_kv() -> None:
    """Replicated attention weights and the whole embedding cost memory; the KV cache per rank holds
    only its own requests' tokens under both (the dense baseline splits KV heads instead)."""
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import load_topology

    topo = load_topology("h200x8-ib400")
    for model in ("tiny-qwen3", "tiny-deepseek-v3"):
        g = _graph(model)
        n, b = 2, 2
        base, dp = (make_plan(p, g, n) for p in ("baseline", "dp-attention"))
        mb, md = (cached_predictor(g, p, topo, Mesh(n, pp=1), "bf16", None).memory(None, 64) for p in (base, dp))
        assert md.replicated_extra > 0 == mb.replicated_extra
        # The whole embedding: (N-1)/N of the table more per rank, besides the attention weights,
        # and the audit's replication price says the same.
        table = g.spec.vocab * g.hidden * b
        assert md.weights - mb.weights == pytest.approx(md.replicated_extra)
        assert md.replicated_extra == pytest.approx(audit_plan(g, dp, n).replicated_extra_bytes)
        assert md.replicated_extra > table * (n - 1) / n  # the attention weights come on top
        # KV: with every head, 1/N of the tokens. GQA at TP2 splits its 2 KV heads, the same bytes;
        # MLA caches its latent whole on every rank under TP: DP divides it by N.
        if model == "tiny-qwen3":
            assert md.kv_cache == pytest.approx(mb.kv_cache)
        else:
            assert md.kv_cache == pytest.approx(mb.kv_cache / n)


def test_named_dp_plans_are_legal_on_moe_and_dense_families() -> None:
    for model in ("tiny-deepseek-v3", "tiny-qwen3", "tiny-llama", "tiny-kimi-k3"):
        g = _graph(model)
        for name in (*DP_PLANS, *(("dp-attention+ep2",) if g.has_routed_experts else ())):
            assert audit_plan(g, make_plan(name, g, 2), 2).legal, (model, name)
        if not g.has_routed_experts:  # an expert plan on a dense model is refused, not run as plain DP
            with pytest.raises(TpplanError, match="no routed experts"):
                make_plan("dp-attention+ep2", g, 2)


def test_per_request_reference_differs_from_one_sequence() -> None:
    """The DP reference runs each rank's request on its own: attention over one long sequence gives
    other values, so a DP run that mixed requests could not pass."""
    from tpplan.runtime.executor import numerics_for
    from tpplan.runtime.verify import _reference
    from tpplan.runtime.weights import random_weights

    g = _graph("tiny-qwen3")
    nu = numerics_for(g)
    w = random_weights(g, nu, seed=0)
    ids = torch.randint(0, g.spec.vocab, (8,), generator=torch.Generator().manual_seed(1))
    one = _reference(g, w, ids, None, nu, torch.device("cpu"), torch.float32)
    dp = _reference(g, w, ids, None, nu, torch.device("cpu"), torch.float32, dp_ranks=2)
    assert torch.allclose(one["hidden"][0][:4], dp["hidden"][0][:4], atol=1e-5)  # rank 0's request = the prefix
    assert not torch.allclose(one["hidden"][0][4:], dp["hidden"][0][4:], atol=1e-3)  # rank 1's starts anew


def _explain(r: CaseResult) -> str:
    return f"{r.case.label} TP{r.n}: max rel {r.max_rel:.2e}, trace ok {r.trace_matches}"


MODELS = ("tiny-deepseek-v3", "tiny-qwen3", "tiny-llama", "tiny-kimi-k3")


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_dp_plans_equal_the_unsharded_model_and_the_prediction(n: int) -> None:
    """Every DP plan (TP MoE in both paddings, EP, all-to-all, vLLM DP+EP) on MoE, GQA and K3 models:
    7 tokens in chunks of 4 (a rank idle in the 3-token chunk at N=4, KV cache carried per request)."""
    plans = (*DP_PLANS, f"dp-attention+ep{n}")
    moe = {m for m in MODELS if _graph(m).has_routed_experts}  # dp-attention+ep<k> is refused on a dense model
    cases = [
        VerifyCase(m, p, tokens=7, chunk=4)
        for m in MODELS
        for p in plans
        if (m != "tiny-llama" or "ep" not in p) and (m in moe or not p.startswith("dp-attention+ep"))
    ]
    results = verify_cases(cases, nproc=n, timeout_s=120)
    assert len(results) == len(cases)
    bad = [_explain(r) for r in results if not r.passed]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.max_rel < 1e-4 and not r.fallback_traced
        kinds = {c.kind for c in r.traced[0]}
        if r.case.plan == "dp-attention":
            assert kinds == {"all_reduce"}, r.case.label
        if r.case.plan == "dp-attention-maxlen" and r.case.model != "tiny-kimi-k3":  # K3: latent norm all-reduces
            assert kinds == {"all_gather", "reduce_scatter"}, r.case.label


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-deepseek-v3", "tiny-qwen3"])
def test_dp_attention_with_transformers_weights_equals_transformers_per_request(model: str, tmp_path) -> None:
    """Transformers' own model on each DP rank's request gives the logits of tpplan's per-request
    reference, and the DP run (2 ranks, those weights read from safetensors) equals that reference."""
    pytest.importorskip("transformers")
    import transformers
    from hf_models import build_hf_model
    from safetensors.torch import save_file
    from test_hf_parity import MODELS as HF

    from tpplan.layout.schedule import token_range
    from tpplan.models.config import load_config_dict
    from tpplan.runtime.executor import run_reference
    from tpplan.runtime.weights import normalize_names, numerics_from_config

    raw, _ = load_config_dict(model)
    hf = build_hf_model(transformers, raw, HF[model])
    weights = normalize_names({k: v.detach().contiguous() for k, v in hf.state_dict().items()})
    save_file(weights, str(tmp_path / "model.safetensors"))
    g, nu = _graph(model), numerics_from_config(raw)
    tokens, seed = 7, 4
    ids = torch.randint(0, g.spec.vocab, (tokens,), generator=torch.Generator().manual_seed(seed + 1))
    for r in range(2):  # the same ids verify draws (seed + 1)
        request = ids[slice(*token_range(tokens, 2, r))]
        with torch.no_grad():
            theirs = hf(input_ids=request[None]).logits[0]
        ours = run_reference(g, weights, request, numerics=nu)
        assert (ours - theirs).abs().max().item() < 1e-4
    plans = ("dp-attention", "dp-attention-maxlen", "vllm-dp-ep")
    cases = [VerifyCase(model, p, tokens=tokens, seed=seed, weights=str(tmp_path)) for p in plans]
    results = verify_cases(cases, nproc=2, timeout_s=120)
    assert all(r.passed for r in results), [_explain(r) for r in results]


def test_search_ranks_the_dp_plans_beside_found_ones_and_their_files_keep_the_decision(tmp_path) -> None:
    """`run_search(dp_attention=True)`: the named DP plans enter the ranking with the figure every
    ranked plan has (volume: the audit's bytes per token); the search's own plans are unchanged,
    and a saved plan file loads back with its `dp_attention`."""
    from tpplan.plans.files import load_plan_file, save_plan_dir
    from tpplan.search.ranking import run_search

    without = run_search("tiny-deepseek-v3", None, tp=2, objective="volume", top=8)
    with_dp = run_search("tiny-deepseek-v3", None, tp=2, objective="volume", top=8, dp_attention=True)
    g = _graph("tiny-deepseek-v3")
    by_name = {e["name"]: e for e in with_dp.data["plans"]}
    for name in DP_PLANS:
        assert by_name[name]["score"] == pytest.approx(audit_plan(g, make_plan(name, g, 2), 2).comm_bytes_per_token)
    found = [e["name"] for e in without.data["plans"] if e["found_by"] == "search"]
    assert [e["name"] for e in with_dp.data["plans"] if e["found_by"] == "search"] == found[: len(
        [e for e in with_dp.data["plans"] if e["found_by"] == "search"])]  # fmt: skip
    scores = [e["score"] for e in with_dp.data["plans"]]
    assert scores == sorted(scores)
    i = next(i for i, e in enumerate(with_dp.data["plans"]) if e["name"] == "dp-attention")
    path = save_plan_dir(tmp_path / "plans", with_dp.plan_files)[i]
    back = load_plan_file(str(path), g, 2)
    assert back.dp_attention == "sum_len"
    assert audit_plan(g, back, 2).comm_bytes_per_token == by_name["dp-attention"]["score"]


@pytest.mark.parametrize(("width", "n", "tokens"), [(64, 2, 6), (64, 4, 7), (48, 4, 3)])
def test_dp_transition_volume_equals_schedule_bytes(width: int, n: int, tokens: int) -> None:
    """SUM_LEN's all-reduces move the [T, W] buffer of every rank's rows: the planner's ring volume
    equals the schedule's buffer through ring_sent_bytes (no padding: T rows, not N*ceil(T/N))."""
    from tpplan.layout.schedule import ring_sent_bytes

    for move in DP_TRANSITIONS.values():
        assert move.collective is not None
        shape = move.call_shape(width, 0, n, tokens)
        assert shape == (tokens, width)
        assert ring_sent_bytes(move.collective.value, tokens * width * 2, n) == pytest.approx(
            move.elements_per_rank(width, 0, n, tokens) * 2
        )
        assert move.layout_copy("v", width, 0, n, tokens) is None
