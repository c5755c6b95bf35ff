"""Time the P/D library on real models: the bound, the ratio choice and a served deployment.

Usage: `python tools/bench_pd.py` (docs/benchmarks.md, "P/D disaggregation"). DeepSeek-V3 on 2 nodes
(prefill and decode TP8) and Kimi-K3 on 4 nodes (prefill TP8, decode TP16) of h200x8-ib400, SGLang 0.5.23,
baseline plans, Poisson 5 req/s of (4,000, 500) and (12,000, 300) prompts/outputs: `capacity` (the
bound, cold and with a TPOT target), `choose_ratio` over the cluster's GPUs from the bound alone, and
`serve_disaggregated` of the chosen ratio on 400 requests.
Prints CPU seconds (process time, less sensitive to a shared machine's load) and wall seconds.
"""

from __future__ import annotations

import time

from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import Topology, load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import ModelGraph, build_model_graph
from tpplan.plans.named import make_plan
from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, capacity, choose_ratio, serve_disaggregated
from tpplan.simulate.requests import Shape, poisson

CASES = (("deepseek-v3", 2, 8, 8), ("kimi-k3", 4, 8, 16))  # model, nodes, prefill TP, decode TP


def pool(graph: ModelGraph, topo: Topology, tp: int) -> PoolSpec:
    p = cached_predictor(graph, make_plan("baseline", graph, tp), topo, Mesh(tp), "bf16", None,
                         pipeline=pipeline_model("sglang@0.5.23"))  # fmt: skip
    return PoolSpec(p)


def main() -> None:
    arrivals = poisson(5.0, [Shape(4000, 500), Shape(12000, 300)], 400, seed=0)
    for model, nodes, tp_p, tp_d in CASES:
        graph = build_model_graph(load_model(model))
        topo = load_topology("h200x8-ib400", nodes=nodes)

        w0, t0 = time.perf_counter(), time.process_time()
        pre, dec = pool(graph, topo, tp_p), pool(graph, topo, tp_d)
        bound = capacity(DisaggDeployment(pre, dec), arrivals)
        t1 = time.process_time()
        capacity(DisaggDeployment(pre, dec), arrivals, tpot_s=0.05)
        t2 = time.process_time()
        choice = choose_ratio(pre, dec, arrivals, gpus=topo.world_size, simulate=False)
        t3 = time.process_time()
        served = serve_disaggregated(choice.chosen, arrivals)
        t4, w4 = time.process_time(), time.perf_counter()
        print(f"{model} on {nodes}x8, prefill TP{tp_p}, decode TP{tp_d}: capacity {t1 - t0:.2f} s, with a TPOT "
              f"target {t2 - t1:.2f} s, choose_ratio {t3 - t2:.3f} s ({len(choice.table)} ratios, chose "
              f"{choice.chosen.ratio}), serve 400 requests {t4 - t3:.2f} s (all {t4 - t0:.2f} s CPU, "
              f"{w4 - w0:.2f} s wall)"
              f"; {served.binding_text()}; {bound}")  # fmt: skip


if __name__ == "__main__":
    main()
