"""The cost model: what a plan costs on a cluster, in seconds and bytes. Imports no torch.

Its modules, by the question each answers (the flat layout keeps the import paths every stage uses):

- Inputs, each validated once: `gpu` (a GPU model: its device, software stack and kernel sources),
  `cluster` (nodes, fabric, collective curves; `curve_sets`), `topology` (a file naming one GPU model
  and one cluster), `deployment` (R x TP x CP x PP x EP on that cluster), `workload` (requests ->
  chunked-prefill batches -> TTFT), `segments` (a batch as (new tokens, context) per request).
- The two pricers, the only places a price is made:
  - `compute` (`ShapePrices`): one op class at one per-rank shape on a GPU model, from its kernel sources
    (`kernel_source`, the AIC adapter in `sources/`), the GEMM table (`gemm`), the fitted kernel
    models (`kernel_models`, `kernel_fit`) or the roofline;
  - `collective_pricer` (`price_collective`): one collective (kind, bytes, group, algorithm) on a cluster,
    from measured curves, calibrated constants, a source or the link model (`collectives` holds the
    arithmetic).
- A plan priced: its lowered program's steps (`tpplan.lower`) through the two step pricers,
  `kernel_pricer` (a kernel call -> its price) and `collective_pricer` (a collective, layout copy or
  stage send -> its price), held with the plan's lowering by `plan_steps` -> `predictor` (summed into
  layers, pipeline stages and memory) -> `predict` (the entry point, `predict_plan`) -> `prediction`
  (the typed result and its JSON). `pricing` hands the same prices out one decision at a time to the
  search, so the two cannot drift apart.
- How the engines schedule it: `pipeline` and `stages` (PP), `context_parallel` (CP), `overlap`
  (two-micro-batch overlap), `async_tp` (GEMM + collective fusion).
- How sure: `bands` (a prediction's error band from the out-of-sample errors of what it sums) and
  `provenance` (which source priced each op class).
"""
