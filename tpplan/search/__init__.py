"""Search for the best legal plan: enumerate decisions from the graph, optimise per layer kind.

The package, in the order a search runs:

- `space`: global choices (stream, reduce target, MoE mode and EP size) and the per-kind decision
  sites a walk over a layer's ops finds (`enumerate_kind` lists every leaf, for brute force);
- `objectives`: what is minimised, priced additively per op decision and collective
  (`PredictObjective` through the cost model's public `tpplan.cost.pricing.Pricer`);
- `fronts`: k-Pareto fronts of (score, memory);
- `walk`: one layer kind optimised for every global choice (`KindSolver`);
- `combine`: the kinds combined over the real layer order under the memory cap (`search`);
- `naming`: names and words for found plans, and recognising named plans;
- `ranking`: `tpplan search`'s answer: every TP x PP deployment searched, ranked plans re-audited
  and predicted, each also a plan file (`run_search`, `search_report`).

docs/design.md ("Search") has the argument for exactness; tests/test_search.py checks it against
brute force.
"""

from tpplan.search.combine import Candidate, SearchResult, search
from tpplan.search.fronts import cost_key, skyline
from tpplan.search.naming import behaviour, describe, named_behaviours
from tpplan.search.objectives import (
    ZERO,
    Cost,
    Objective,
    PredictObjective,
    RooflineObjective,
    VolumeObjective,
    layer_cost,
    plan_cost,
    ttft_batches,
    ttft_shapes,
)
from tpplan.search.ranking import JSON_SCHEMA_VERSION, SearchOutcome, deployments, run_search, search_report
from tpplan.search.space import (
    GlobalChoice,
    KindConfig,
    SpaceOptions,
    enumerate_kind,
    global_choices,
    make_search_plan,
)
from tpplan.search.walk import optimise_kind

__all__ = [
    "JSON_SCHEMA_VERSION",
    "ZERO",
    "Candidate",
    "Cost",
    "GlobalChoice",
    "KindConfig",
    "Objective",
    "PredictObjective",
    "RooflineObjective",
    "SearchOutcome",
    "SearchResult",
    "SpaceOptions",
    "VolumeObjective",
    "behaviour",
    "cost_key",
    "deployments",
    "describe",
    "enumerate_kind",
    "global_choices",
    "layer_cost",
    "make_search_plan",
    "named_behaviours",
    "optimise_kind",
    "plan_cost",
    "run_search",
    "search",
    "search_report",
    "skyline",
    "ttft_batches",
    "ttft_shapes",
]
