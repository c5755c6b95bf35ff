"""The DP-attention plans' engine lines (`tpplan.engines.recipes.dp_attention`): the flags each engine
needs, and which plan each engine really runs (SGLang prefill pads SUM_LEN, not MAX_LEN)."""

from __future__ import annotations

import pytest

from tpplan.engines import Launch
from tpplan.engines.recipes.base import family
from tpplan.engines.recipes.sglang import sglang_recipe
from tpplan.engines.recipes.vllm import vllm_recipe
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

CASES = {
    # plan: (SGLang realises, flags it must carry; vLLM realises, flags it must carry)
    "dp-attention": ("yes", ("--dp-size 8", "--enable-dp-attention", "--moe-a2a-backend none"), "no", ()),
    "dp-attention-maxlen": ("partly", ("--dp-size 8", "--enable-dp-attention"), "no", ()),
    "dp-attention+ep8": ("yes", ("--enable-dp-attention", "--ep-size 8", "--moe-a2a-backend none"), "no", ()),
    "dp-attention+a2a": (
        "yes", ("--enable-dp-attention", "--moe-a2a-backend deepep"),
        "partly", ("--data-parallel-size 8", "--enable-expert-parallel", "--all2all-backend deepep_high_throughput"),
    ),
    "vllm-dp-ep": (
        "no", (),
        "yes", ("--tensor-parallel-size 1", "--data-parallel-size 8", "--enable-expert-parallel",
                "--all2all-backend allgather_reducescatter"),
    ),
    "vllm-dp": ("no", (), "yes", ("--tensor-parallel-size 1", "--data-parallel-size 8")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_dp_plans_engine_lines(name: str) -> None:
    spec = load_model("deepseek-v3")
    plan = make_plan(name, build_model_graph(spec), 8)
    assert family(plan) == name.replace("+ep8", "+ep")
    sgl_ok, sgl_flags, vllm_ok, vllm_flags = CASES[name]
    for recipe, ok, flags in ((sglang_recipe(plan, spec, mesh=Mesh(8)), sgl_ok, sgl_flags),
                              (vllm_recipe(plan, Launch(spec, Mesh(8))), vllm_ok, vllm_flags)):  # fmt: skip
        assert recipe.realises == ok, (recipe.engine, recipe.summary)
        assert all(f in recipe.args for f in flags), (recipe.engine, recipe.args)
        assert bool(recipe.command()) == (ok != "no")
    if name == "vllm-dp":
        assert "--enable-expert-parallel" not in vllm_recipe(plan, Launch(spec, Mesh(8))).args
