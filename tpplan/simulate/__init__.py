"""The engine's serving loop: requests arriving, steps formed as the engine's scheduler forms them,
priced by the cost model, run through the pipeline stages; per-request timelines and TTFT percentiles.

- `requests.py`: requests and arrivals (closed loop, Poisson, trace), a dealt split over replicas;
- `loop.py`: the discrete-event loop of one replica and `simulate` over replicas;
- `routing.py`: the engines' routers (round-robin, least-loaded, SGLang's cache-aware), run by
  `replicas.py` (replicas behind a load-aware router) and `disagg_loop.py` (P/D), both on `cosim.py`;
- `prices.py`: the seam to the cost model (a step's price per stage, cached);
- `results.py`: timelines and aggregates (mean, p50/p90/p99, queueing share, prefill throughput).
Torch-free planner code; it sits above `cost` (which never imports it). docs/cost-model.md, "Serving loop".
"""
