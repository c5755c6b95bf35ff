"""Search for the best legal plan: enumerate decisions from the graph, optimise per layer kind.

The package, in the order a search runs:

- `space`: global choices (stream, reduce target, MoE mode and EP size) and the per-kind decision
  sites a walk over a layer's ops finds (`enumerate_kind` lists every leaf, for brute force);
- `objectives`: what is minimised, priced additively per op decision and collective
  (`PredictObjective` through the cost model's public `tpplan.cost.pricing.Pricer`);
- `fronts`: k-Pareto fronts of (score, memory);
- `walk`: one layer kind optimised for every global choice (`KindSolver`);
- `replay`: the walk's steps worked out once per distinct situation and replayed (`StepMemo`);
- `combine`: the kinds combined over the real layer order under the memory cap (`search`);
- `naming`: names and words for found plans, and recognising named plans;
- `grid`: the deployments a search covers (every TP x PP x CP split of the GPUs, replicas of them);
- `setup`: one search's checked inputs and how it scores one plan at one deployment (`evaluate`);
- `variants`: plans scored beside the search's own (named DP-attention plans, engine overlaps);
- `ranking`: `tpplan search`'s and the memo's one search: every TP x PP deployment searched, the
  ranked plans audited once and predicted, each also a plan file (`search_plans`; `run_search`
  resolves names first);
- `results`: what it hands on, typed (`SearchOutcome`, `RankedPlan`), and their one JSON;
- `targets`, `serving_points`, `under_targets`, `disagg_targets`: the search under TTFT/TPOT targets:
  each deployment's best plan served with decode (aggregated, and P/D pools of the meshes found),
  ranked by goodput per GPU, with the Pareto front (`fronts.pareto_max`) and what binds.

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
from tpplan.search.ranking import MeshAsk, deployments, run_search, search_plans, search_report
from tpplan.search.results import JSON_SCHEMA_VERSION, Excluded, RankedPlan, SearchOutcome, SearchStats
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
    "Excluded",
    "GlobalChoice",
    "KindConfig",
    "MeshAsk",
    "Objective",
    "PredictObjective",
    "RankedPlan",
    "RooflineObjective",
    "SearchOutcome",
    "SearchResult",
    "SearchStats",
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
    "search_plans",
    "search_report",
    "skyline",
    "ttft_batches",
    "ttft_shapes",
]
