"""Server flags that realise a plan in SGLang and vLLM, judged against the engines' own code.

Every engine fact (what a flag does per model class, the per-layer dataflow, the gates with the
server arguments and environment variables behind them, the fallback, how PP is scheduled) lives
once, as versioned data with its sources, in `tpplan.engines` (docs/engines.md). This package turns
that data into launch lines, report conditions and one sentence per engine on what it really runs
for the model class at hand. `engines` selects the versions (`--engine sglang@0.5.23`); the default
is each engine's current release (`tpplan.engines.DEFAULT_ENGINES`).
"""

from __future__ import annotations

from typing import Any

from tpplan.engines import select_pair
from tpplan.engines.schema import EngineVersion
from tpplan.layout.plan import Plan
from tpplan.models.spec import ModelSpec
from tpplan.report.engines.base import Condition, EngineRecipe, family, gpu_capability
from tpplan.report.engines.sglang import sglang_recipe
from tpplan.report.engines.vllm import vllm_recipe


def recipes(
    plan: Plan,
    spec: ModelSpec,
    *,
    prefill_cp: int = 1,
    dp: int = 1,
    engines: tuple[EngineVersion, EngineVersion] | None = None,
    **deployment: Any,
) -> list[EngineRecipe]:
    """Both engines' recipes for one plan at one `deployment` (tp, pp, nodes, chunk, gpu: see
    `sglang_recipe`); `prefill_cp` is SGLang's prefill context parallelism, `dp` vLLM's data-parallel
    size (each engine's gates read the one it has); `engines` the (SGLang, vLLM) versions."""
    sgl, vll = engines or select_pair(None)
    return [
        sglang_recipe(plan, spec, cp=prefill_cp, engine=sgl, **deployment),
        vllm_recipe(plan, spec, dp=dp, engine=vll, **deployment),
    ]


__all__ = ["Condition", "EngineRecipe", "family", "gpu_capability", "recipes", "sglang_recipe", "vllm_recipe"]
