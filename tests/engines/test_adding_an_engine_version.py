"""Adding an engine version is one module in `tpplan/engines/releases/` (issue 30): the module below,
written to a temp folder searched as that package, is an `--engine` choice, its engine's default (the
newest release, unless it says otherwise), a recipe's version, the scheduler rules the serving loop reads,
the KV-sizing formula `kv_capacity` uses, the P/D hand-off and a section of docs/engines.md, with no edit
anywhere else (docs/adding-an-engine-version.md)."""

from __future__ import annotations

import sys

import pytest

import tpplan.cost.kv_capacity
import tpplan.cost.predict  # noqa: F401  (their import-time defaults come from the real registry, not the fake's)
from tpplan import engines
from tpplan.engines import releases
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.simulate.disagg_loop import handoff_rule

# What docs/adding-an-engine-version.md tells a contributor to write (a made-up release, said so): 0.34.0's
# records re-cited, and a scheduler budget, a KV-sizing formula and a P/D hand-off of its own.
MODULE = """
from dataclasses import replace

from tpplan.engines.releases.vllm_0_34_0 import VLLM_0_34_0
from tpplan.engines.schema import BudgetTier, recite
from tpplan.engines.vllm import REL

REL_99 = "0.99.0 (made up for a test)"
OLD = recite(VLLM_0_34_0, REL, REL_99)
SCHEDULING = replace(OLD.scheduling, budget=replace(OLD.scheduling.budget, tiers=(BudgetTier(None, 4096),)))
MEMORY = replace(OLD.memory, gpu_memory_utilization=0.5, extensible=False)
HANDOFF = replace(OLD.handoff, push=True)
RELEASES = (
    replace(OLD, version="0.99.0", released="a made-up release for a test", notes=(), scheduling=SCHEDULING,
            memory=MEMORY, handoff=HANDOFF{default}),
)
"""


def _install(monkeypatch, tmp_path, module: str) -> tuple:
    """The registry as it is at import when `module` sits in `engines/releases/` as vllm_0_99_0.py."""
    (tmp_path / "vllm_0_99_0.py").write_text(module)
    monkeypatch.setattr(releases, "__path__", [*releases.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "tpplan.engines.releases.vllm_0_99_0", raising=False)
    found = releases.discovered()
    for ev in found:
        if ev.key not in engines.ENGINES:
            monkeypatch.setitem(engines.ENGINES, ev.key, ev)
    return found


@pytest.fixture
def with_fake_release(monkeypatch, tmp_path):
    """The registry as it is at import when the module above sits in `engines/releases/`."""
    found = _install(monkeypatch, tmp_path, MODULE.replace("{default}", ""))
    yield tuple(ev for ev in found if ev.key == "vllm@0.99.0")
    sys.modules.pop("tpplan.engines.releases.vllm_0_99_0", None)


def test_the_module_is_an_engine_choice(with_fake_release):
    assert [ev.key for ev in with_fake_release] == ["vllm@0.99.0"]
    ev = engines.select("vllm@0.99.0")
    assert ev.engine == "vLLM" and ev.mode("moe-sp") is not None
    assert ev.mode("moe-sp").gates[0].source.ref == "0.99.0 (made up for a test)"  # re-cited, not 0.34.0's
    sgl, vll = engines.select_pair(["vllm@0.99.0"])
    assert vll is ev and sgl.key == engines.DEFAULT_ENGINES[0]
    from tpplan.cost.gpu import engine_versions

    assert "0.99.0" in engine_versions("vllm", "h200_sxm")  # what `--engine vllm@VERSION` checks


def test_the_newest_release_is_the_engines_default_unless_it_says_otherwise(with_fake_release, monkeypatch, tmp_path):
    (ev,) = with_fake_release
    assert engines.default_release("vLLM") is ev and engines.select("vllm") is ev
    assert engines.select_pair(None)[1] is ev
    from tpplan.cost.kv_capacity import kv_engines_for

    assert kv_engines_for(None) == ("sglang@0.5.23", "vllm@0.99.0")


def test_a_release_that_says_so_is_not_the_default(monkeypatch, tmp_path):
    _install(monkeypatch, tmp_path, MODULE.replace("{default}", ", default=False"))
    assert "vllm@0.99.0" in engines.ENGINES
    assert engines.default_release("vLLM").key == "vllm@0.34.0" == engines.select("vllm").key
    sys.modules.pop("tpplan.engines.releases.vllm_0_99_0", None)


def test_the_serving_loop_reads_its_scheduler_rules(with_fake_release):
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.simulate.engine import engine_loop

    (ev,) = with_fake_release
    rules = engines.scheduler_rules("vllm@0.99.0")
    assert rules is ev.scheduling and rules.budget.default_tokens(141) == 4096  # its own budget, not 0.34.0's 8192
    assert engines.scheduler_rules("vllm@0.34.0").budget.default_tokens(141) == 8192
    assert rules.admission.source.ref == "0.99.0 (made up for a test)"
    pipeline = pipeline_model("vllm@0.99.0")
    assert engine_loop(pipeline, Mesh(2), 4096, 8).rules is rules


def test_the_kv_sizing_uses_its_memory_formula(with_fake_release):
    from tpplan.cost.kv_capacity import kv_capacity
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import load_topology
    from tpplan.plans.named import baseline

    graph = build_model_graph(load_model("tiny-llama"))
    p = cached_predictor(graph, baseline(), load_topology("h100x8-ib400"), Mesh(2), "bf16", None)
    new, old = kv_capacity(p, "vllm@0.99.0"), kv_capacity(p, "vllm@0.34.0")
    assert new.engine == "vllm@0.99.0" and new.settings["gpu_memory_utilization"] == 0.5
    assert new.reserve_text == "50% of the card (gpu_memory_utilization 0.5) + the activation peak"
    assert new.tokens < old.tokens  # half the card: the profiled formula at 0.5, not the extensible cache
    assert all("0.99.0 (made up for a test)" in f for f in new.facts)


def test_the_pd_loop_uses_its_handoff(with_fake_release):
    (ev,) = with_fake_release
    rule, note = handoff_rule("vllm@0.99.0")  # what simulate.disagg's DisaggDeployment.rule returns
    assert rule is ev.handoff and note is None and rule.push and not handoff_rule("vllm@0.34.0")[0].push
    rule, note = handoff_rule("vllm@0.33.0")  # a release that states none: the default release's, said so
    assert rule is ev.handoff and note == "vllm@0.33.0's P/D hand-off was not read; vllm@0.99.0's is used"


def test_without_the_module_the_version_is_refused():
    with pytest.raises(TpplanError, match="no engine data for that version"):
        engines.select("vllm@0.99.0")


def test_docs_engines_md_gains_its_section(with_fake_release):
    from tpplan.engines.doc import render

    doc = render()
    assert "## `vllm@0.99.0`: a made-up release for a test" in doc
    section = doc.split("## `vllm@0.99.0`")[1].split("\n## ")[0]
    assert "0.99.0 (made up for a test)" in section and "0.34.0 (PyPI wheel)" not in section
    assert "### The scheduler, as the serving loop reads it" in section and "### KV-cache sizing" in section
    assert "gpu_memory_utilization" in section and "the prefill side pushes the KV" in section


def test_a_recipe_names_the_new_version(with_fake_release):
    from tpplan.engines.recipes import recipes
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-qwen3"))
    out = recipes(
        make_plan("baseline", graph, 2),
        engines.Launch(graph.spec, Mesh(2)),
        engines=engines.select_pair(["vllm@0.99.0"]),
    )
    assert [r.version for r in out] == [engines.DEFAULT_ENGINES[0], "vllm@0.99.0"]
    assert out[1].engine == "vLLM" and "--tensor-parallel-size" in " ".join(out[1].args)


def test_a_module_whose_releases_are_not_engine_versions_is_one_error(monkeypatch, tmp_path):
    (tmp_path / "broken_release.py").write_text("RELEASES = ('vllm@1.0',)\n")
    monkeypatch.setattr(releases, "__path__", [str(tmp_path)])
    monkeypatch.delitem(sys.modules, "tpplan.engines.releases.broken_release", raising=False)
    with pytest.raises(TpplanError, match=r"RELEASES.*is not a tuple of EngineVersion"):
        releases.discovered()
    sys.modules.pop("tpplan.engines.releases.broken_release", None)


def test_one_version_defined_twice_is_refused():
    ev = engines.select("vllm@0.34.0")
    with pytest.raises(TpplanError, match="defined twice"):
        releases.collect((ev, ev))


def test_the_launch_lines_read_its_overlap_records(with_fake_release):
    """The made-up release re-cites 0.34.0's DBO: its launch line cites it at 0.99.0, under its own label."""
    from tpplan.engines.launch import deployment_flags

    dbo = engines.overlaps("vllm@0.99.0")["dbo"]
    assert dbo.engine == "vLLM 0.99.0" and dbo.schedule_source.ref == "0.99.0 (made up for a test)"
    flags = deployment_flags("vLLM", "deepseek_v3", True, Mesh(8), "dbo", "vllm@0.99.0")
    assert flags.args[-1] == "--enable-dbo" and "0.99.0 (made up for a test)" in flags.source
    refused = deployment_flags("vLLM", "deepseek_v3", True, Mesh(8, pp=2), "dbo", "vllm@0.99.0")
    assert not refused.realised and "0.99.0 (made up for a test)" in refused.why
