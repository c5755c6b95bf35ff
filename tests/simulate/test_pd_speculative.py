"""A P/D prefill server of a speculative decode pool (issue 32): both engines launch it with the decode pool's
speculative flags, load the draft (its weights and KV layers come out of the prefill server's KV pool), run a
draft pass over each prefill step and send the draft's KV with the target's (engines/speculative.PD_PREFILL_SOURCES).
Worked by hand on tiny-deepseek-v3 (3 MLA layers, one MTP layer) at TP 2."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli
from tests.simulate.test_decode_json_docs import DOCS, _block, _documented
from tests.simulate.test_speculative import EAGLE3
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.draft import draft_memory
from tpplan.cost.kv_capacity import kv_capacity
from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.engines.speculative import Speculative, check_pd_draft
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, handoff_seconds
from tpplan.simulate.pd import kv_bytes_per_rank
from tpplan.simulate.prices import predictor_prices, prefill_server_prices

MTP = Speculative(3, 2.5)


def _predictor(engine: str, tp: int = 2):  # type: ignore[no-untyped-def]
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    topo = select_topology("h200x8-ib400", 1)
    return cached_predictor(
        graph, baseline(), topo, Mesh(tp), "bf16", None, engine=engine, pipeline=pipeline_model(engine)
    )


@pytest.fixture(scope="module", params=["sglang@0.5.23", "vllm@0.34.0"])
def p(request):  # type: ignore[no-untyped-def]
    return _predictor(request.param)


def test_a_prefill_step_runs_the_draft_as_the_engine_does(p) -> None:  # type: ignore[no-untyped-def]
    """Two prompts of 300 and 200 new tokens (the first after 100 cached): the prefill server's step is the
    plain step plus, on the last stage, one MTP pass over its 500 tokens: the target's last layer over the same
    segments and the eh_proj over 500 rows, 2H -> H; SGLang's draft extend then samples (the shared lm_head over
    2 rows, H -> V / 2, and the logits' all-gather over TP 2, 2 x V bf16); vLLM's draft prefill does not (its
    max_tokens-1 requests need no drafts: it only fills the draft's KV)."""
    segs = ((300, 100), (200, 0))
    h, v = p.graph.spec.hidden, p.graph.spec.vocab
    gather = price_collective("all_gather", 2 * v * 2, 2, p.topo, ranks_per_node=2, sources=p.comms.sources).time_s
    assert gather > 0
    want = p.kind_time(p.audit.layer_results[-1], segs).total_s + p.kernels.gemm_seconds(500, 2 * h, h)
    if p.pipeline.engine.startswith("sglang"):
        want += p.kernels.gemm_seconds(2, h, v // 2) + gather
    plain = predictor_prices(p)(segs)
    got = prefill_server_prices(p, MTP)(segs)
    assert list(got[:-1]) == list(plain[:-1])
    assert got[-1] - plain[-1] == pytest.approx(want)
    assert prefill_server_prices(p, None)(segs) == plain  # no --spec: the plain server


def test_the_prefill_servers_kv_pool_holds_the_draft(p) -> None:  # type: ignore[no-untyped-def]
    """The prefill server loads the draft as the decode server does: its KV figure is the decode pool's
    (`kv_capacity` with the draft's nextn layer: the cell 3 -> 4 MLA layers, its weights off the pool)."""
    draft = draft_memory(p, MTP)
    assert draft is not None and draft.layers == 1 and draft.weights > 0
    plain = kv_capacity(p, p.pipeline.engine, pd=True)
    with_draft = kv_capacity(p, p.pipeline.engine, pd=True, draft=draft)
    assert with_draft.tokens < plain.tokens * 3 / 4


def test_the_hand_off_carries_the_drafts_kv(p) -> None:  # type: ignore[no-untyped-def]
    """tiny-deepseek-v3's three MLA layers cache the same cell per token, and the MTP layer is the last one's:
    a prompt's KV per rank with the draft is 4/3 of the target's alone, and the hand-off takes longer."""
    draft = draft_memory(p, MTP)
    for tokens in (1, 448):
        target = kv_bytes_per_rank(p, tokens)
        cell = p.kv_per_token(p.graph.spec.layers[-1].attn)
        assert target == pytest.approx(3 * cell * tokens)
        assert kv_bytes_per_rank(p, tokens, draft) == pytest.approx(4 * cell * tokens)
    plain = DisaggDeployment(PoolSpec(p), PoolSpec(p))
    spec = DisaggDeployment(PoolSpec(p), PoolSpec(p, speculative=MTP))
    assert handoff_seconds(spec, 448) > handoff_seconds(plain, 448)


def test_vllm_refuses_a_head_sharded_draft_to_a_narrower_decode() -> None:
    """vLLM's NixlConnector refuses a non-MLA draft under an MLA target where the decode TP is below the
    prefill TP; an MLA draft, a decode TP at least the prefill's, or SGLang pass."""
    with pytest.raises(TpplanError) as e:
        check_pd_draft("vllm@0.34.0", Mesh(4), Mesh(2), target_latent=True, draft_latent=False)
    assert "_validate_remote_agent_handshake" in e.value.reason and e.value.where == "pd=tp4:tp2"
    check_pd_draft("vllm@0.34.0", Mesh(4), Mesh(2), target_latent=True, draft_latent=True)
    check_pd_draft("vllm@0.34.0", Mesh(2), Mesh(4), target_latent=True, draft_latent=False)
    check_pd_draft("sglang@0.5.23", Mesh(4), Mesh(2), target_latent=True, draft_latent=False)
    check_pd_draft("vllm@0.34.0", Mesh(4), Mesh(2), target_latent=False, draft_latent=False)


AUDIT = ("audit", "-m", "tiny-deepseek-v3", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline", "--json", "-")


def _pd(monkeypatch, capsys, tmp_path, *extra: str):  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,33\n0.001,256,21\n")
    return run_cli(monkeypatch, capsys, *AUDIT, "--trace", str(trace), *extra)


def test_audit_pd_json_carries_the_prefill_servers_draft(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    runs = []
    for extra in ((), ("--spec", "mtp:3:2.5")):
        code, out, err = _pd(monkeypatch, capsys, tmp_path, "--pd", "tp2:tp2:1:1", *extra)
        assert code == 0, err
        runs.append(json.loads(out)["plans"][0]["serving"]["disaggregated"])
    plain, spec = runs
    server = spec["speculative"]["prefill_server"]
    assert server["draft"]["layers"] == 1 and server["draft_samples"] is True  # SGLang: the draft extend samples
    assert "process_batch_result_disagg_prefill" in server["sources"][0]
    assert server["kv_capacity"] is not None
    assert spec["transfer"]["handoff_mean_s"] > plain["transfer"]["handoff_mean_s"]  # the draft's KV goes along
    assert spec["ttft"]["mean_s"] > plain["ttft"]["mean_s"]  # the draft pass and the larger hand-off
    doc = (DOCS / "audit-json.md").read_text(encoding="utf-8")
    documented = _documented(_block(doc, '"disaggregated": {'))
    assert set(server) | {"prefill_server"} <= documented, set(server) - documented


def test_audit_pd_refuses_what_vllms_connector_refuses(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An EAGLE-3 draft of plain (GQA) attention at tiny-deepseek-v3's hidden size and vocabulary under its MLA,
    prefill TP 2 into decode TP 1 on vLLM: one line, exit 2, naming the gate."""
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(EAGLE3))
    code, _, err = _pd(monkeypatch, capsys, tmp_path, "--pd", "tp2:tp1:1:1", "--engine", "vllm@0.34.0", "--spec",
                       f"eagle:3:2:{draft}")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "_validate_remote_agent_handshake" in err and "--pd" in err
