"""Memo truth for PP: the sentence saying which engine behaviour PP TTFT assumes is worded from the very
schedule that priced it (the first --engine, default the current SGLang release)."""

from __future__ import annotations

import pytest

from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import Topology, load_topology
from tpplan.cost.workload import Workload
from tpplan.mesh import Mesh
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk
from tpplan.simulate.engine import pp_unpriced


def two_nodes_of_one() -> Topology:
    """Two nodes of one GPU each: the memo adds TP1 x PP2 variants, cheap for a tiny model."""
    data = load_topology("h200x8-ib400", nodes=2).model_dump()
    data["gpus_per_node"] = 1
    return Topology.model_validate(data)


@pytest.mark.parametrize("engines", [None, ["vllm@0.33.0"], ["sglang@0.5.23", "vllm@0.33.0"]])
def test_the_memo_states_the_schedule_that_priced_pp(engines) -> None:
    seen = []

    def recording(*args, **kw):
        seen.append((kw["mesh"].pp, kw.get("pipeline")))
        return predict_plan(*args, **kw)

    wl = Workload(name="w", input_len=512, concurrency=2, chunk_size=256)
    a = analyse(
        "tiny-llama",
        two_nodes_of_one(),
        [wl],
        MemoAsk(deployment=MeshAsk(tp=2), engines=tuple(engines or ()), search_top=0),
        predictor=recording,
    )
    used = {m for pp, m in seen if pp > 1}
    assert len(used) == 1 and all(m is None for pp, m in seen if pp == 1)
    (model,) = used
    expected = (engines or ["sglang@0.5.23"])[0]
    assert model.engine == a.pp_engine == expected
    md = build_memo(a).markdown
    assert model.assumption(Mesh(1, pp=2)) + "." in md
    unpriced = pp_unpriced(model)  # what the serving loop leaves out (it prices the scheduler's CPU per step)
    assert unpriced and f"Not priced ({model.label}): " + "; ".join(unpriced) + "." in md
    assert md.count("PP TTFT is priced as ") == 1  # one engine's behaviour, not both
    other = "SGLang 0.5.23" if expected.startswith("vllm") else "vLLM 0.33.0"
    assert f"PP TTFT is priced as {other}" not in md


def test_the_first_engine_given_is_the_one_the_memo_launches() -> None:
    """`--engine vllm@...` prices the memo with vLLM's loop and tables: where vLLM's flags run a plan, its verdict
    and the bottom line's launch line are vLLM's, not SGLang's (which the memo cited first whatever was given)."""
    from tpplan.report.verdicts import deciding_engine, engine_ok

    wl = Workload(name="w", input_len=512, concurrency=2, chunk_size=256)
    ask = MemoAsk(deployment=MeshAsk(tp=2), engines=("vllm@0.33.0",), search_top=0)
    a = analyse("tiny-llama", two_nodes_of_one(), [wl], ask)
    run_by_vllm = [v for v in a.variants if any(e.engine == "vLLM" and engine_ok(e) for e in v.engines)]
    assert run_by_vllm
    for v in run_by_vllm:
        chosen = deciding_engine(v.engines)
        assert chosen is not None and chosen.engine == "vLLM" and chosen.version == "vllm@0.33.0", v.key
