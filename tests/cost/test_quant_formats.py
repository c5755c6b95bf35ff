"""Each weight format is priced from kernel rows of that format (issue 34): block-scaled fp8 from
block-scaled rows, per-tensor fp8 from per-tensor rows, mxfp4/nvfp4/int4 as the config says, and a
note in the band's basis where a table lacks the format and other rows stand in."""

from __future__ import annotations

import pytest

from tpplan.cost import plan_steps
from tpplan.cost.kernel_source import AttentionShape, CollectiveShape, GemmShape, KernelPrice, MoeShape
from tpplan.cost.predict import predict_plan
from tpplan.cost.provenance import composed_provenance, provenance
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_config_dict, load_model, spec_from_config
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

TOPO = load_topology("h200x8-ib400")


class Recorder:
    """A kernel source that answers every GEMM and MoE, recording the formats it was asked for."""

    name = "recorder"

    def __init__(self, lacks: str = "") -> None:
        self.gemm_dtypes: set[str] = set()
        self.moe_dtypes: set[str] = set()
        self.lacks = lacks

    def gemm(self, shape: GemmShape) -> KernelPrice | None:
        self.gemm_dtypes.add(shape.dtype)
        return KernelPrice(1e-5, "recorder:gemm")

    def moe(self, shape: MoeShape) -> KernelPrice | None:
        self.moe_dtypes.add(shape.dtype)
        if shape.dtype == self.lacks:  # as the AIC source does where its table lacks the format
            return KernelPrice(1e-3, f"recorder:moe-fp8 (stand-in for {shape.dtype})", True)
        return KernelPrice(1e-3, "recorder:moe")

    def attention(self, shape: AttentionShape) -> KernelPrice | None:
        return None

    def collective(self, shape: CollectiveShape) -> KernelPrice | None:
        return None


def _priced(monkeypatch: pytest.MonkeyPatch, graph, rec: Recorder, tp: int = 8):
    monkeypatch.setattr(plan_steps, "kernel_sources", lambda gpu, engine=None: (rec,))
    # an engine name of its own per recorder: predictions are memoised per engine
    name = f"recorder-{id(rec)}"
    return predict_plan(graph, make_plan("baseline", graph, tp), TOPO, mesh=Mesh(tp), tokens=4096, engine=name)


def _with_quant(preset: str, quant: dict | None):
    raw, _ = load_config_dict(preset)
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    return build_model_graph(spec_from_config(raw if quant is None else {**raw, "quantization_config": quant}))


def test_deepseek_v3_asks_for_block_scaled_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    _priced(monkeypatch, build_model_graph(load_model("deepseek-v3")), rec)
    assert rec.moe_dtypes == {"fp8_block"}
    assert "fp8_block" in rec.gemm_dtypes and "fp8" not in rec.gemm_dtypes


@pytest.mark.parametrize(
    ("quant", "moe"),
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),  # per-tensor
        (None, "bf16"),
    ],
)
def test_the_config_decides_the_rows_asked_for(monkeypatch: pytest.MonkeyPatch, quant: dict | None, moe: str) -> None:
    rec = Recorder()
    _priced(monkeypatch, _with_quant("deepseek-v3", quant), rec)
    assert rec.moe_dtypes == {moe}


def test_weight_only_formats_ask_for_their_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    _priced(monkeypatch, build_model_graph(load_model("kimi-k25")), rec)  # compressed-tensors int4 experts
    assert rec.moe_dtypes == {"int4"}
    rec = Recorder()
    _priced(monkeypatch, build_model_graph(load_model("gpt-oss-120b")), rec)  # mxfp4 experts
    assert rec.moe_dtypes == {"mxfp4"}


def test_a_stand_in_format_is_named_in_the_bands_basis(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = build_model_graph(load_model("deepseek-v3"))
    pred = _priced(monkeypatch, graph, Recorder(lacks="fp8_block"))
    basis = composed_provenance(provenance(TOPO, 8), pred).basis
    assert "fp8_block experts: the engine's tables lack fp8_block" in basis
    clean = _priced(monkeypatch, graph, Recorder())
    assert "weight formats" not in composed_provenance(provenance(TOPO, 8), clean).basis


def test_deepseek_v3_block_fp8_moe_at_tp8_8k_is_trtllms_block_scaled_row() -> None:
    """Issue 34: TRT-LLM's per-tensor fp8 row is 2.085 ms, its block-scaled row 4.980 ms; the
    checkpoint is block-scaled (weight_block_size [128, 128]), so the experts op is the latter."""
    pytest.importorskip("aiconfigurator_core")
    from tpplan.cost.sources.aic import AicSource

    graph = build_model_graph(load_model("deepseek-v3"))
    pred = predict_plan(graph, make_plan("baseline", graph, 8), TOPO, mesh=Mesh(8), tokens=8192, engine="trtllm")
    (experts,) = [o for kt in pred.kinds if kt.kind == "mla+moe" for o in kt.ops if o.category == "moe"]
    src = AicSource("h200_sxm", "trtllm")
    view = src.table("moe")
    block = next(view[q] for q in view if q.name == "fp8_block")
    row_ms = block["balanced"][8][256][7168][2048][8][1][8192]["latency"]
    assert experts.seconds * 1e3 == pytest.approx(row_ms, rel=0.05)
    assert "fp8_block" in str(experts.source) and experts.note is None
