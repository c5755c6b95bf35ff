"""TPOT grows with the KV length exactly as the priced attention does, through the serving loop (issue 32):
one request whose prompt is cached but its last token (so its prefill is one token reading the whole context)
decodes four tokens at 4M and at 8M tokens of context; the loop's TPOT difference equals the decode step's
price difference, and that is the attention ops' difference summed over the layers (nothing else in the step
reads the context)."""

from __future__ import annotations

import pytest

from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.simulate.engine import engine_loop, serve
from tpplan.simulate.requests import Request, Timed

SHORT, LONG, OUT = 1 << 22, 1 << 23, 5


@pytest.mark.parametrize("engine", ["sglang@0.5.23", "vllm@0.34.0"])
def test_loop_tpot_grows_with_kv_as_the_attention_price(engine: str) -> None:
    graph = build_model_graph(load_model("tiny-llama"))
    p = cached_predictor(graph, baseline(), load_topology("h200x8-ib400"), Mesh(1), "bf16", None,
                         pipeline=pipeline_model(engine))  # fmt: skip
    loop = engine_loop(p.pipeline, p.deployment, 8192, 8, decode=True)

    def tpot(ctx: int) -> float:
        res = serve(p, Timed((Request(0, 0.0, ctx, OUT, ctx - 1),)), loop)
        return res.timelines[0].tpot_s

    def step(ctx: int) -> float:
        return sum(p.stage_times(((1, ctx),))[0])

    def attention(ctx: int) -> float:
        res = {id(r): r for r in p.audit.layer_results}.values()
        return sum(r_kt.count * o.seconds for r_kt in (p.kind_time(r, ((1, ctx),)) for r in res)
                   for o in r_kt.ops if o.category == "attention")  # fmt: skip

    grew = tpot(LONG) - tpot(SHORT)
    # decode token k reads SHORT + k or LONG + k positions: the same difference for every k (linear in the KV)
    per_step = [step(LONG + k) - step(SHORT + k) for k in range(OUT - 1)]
    assert grew > 0.5 * tpot(SHORT)  # the KV read is most of the step here
    assert grew == pytest.approx(sum(per_step) / len(per_step), rel=1e-9)
    assert per_step[0] == pytest.approx(attention(LONG) - attention(SHORT), rel=1e-9)
