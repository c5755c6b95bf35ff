"""Adding an engine version is one module in `tpplan/engines/releases/` (issue 30): the module below,
written to a temp folder searched as that package, is an `--engine` choice, a recipe's version and a
section of docs/engines.md, with no edit anywhere else (docs/adding-an-engine-version.md)."""

from __future__ import annotations

import sys

import pytest

from tpplan import engines
from tpplan.engines import releases
from tpplan.errors import TpplanError

# What docs/adding-an-engine-version.md tells a contributor to write (a made-up release, said so).
MODULE = """
from dataclasses import replace

from tpplan.engines.schema import recite
from tpplan.engines.vllm import REL, VLLM_0_34_0

REL_99 = "0.99.0 (made up for a test)"
RELEASES = (
    replace(recite(VLLM_0_34_0, REL, REL_99), version="0.99.0", released="a made-up release for a test", notes=()),
)
"""


@pytest.fixture
def with_fake_release(monkeypatch, tmp_path):
    """The registry as it is at import when the module above sits in `engines/releases/`."""
    (tmp_path / "vllm_0_99_0.py").write_text(MODULE)
    monkeypatch.setattr(releases, "__path__", [*releases.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "tpplan.engines.releases.vllm_0_99_0", raising=False)
    found = releases.discovered()
    for ev in found:
        monkeypatch.setitem(engines.ENGINES, ev.key, ev)
    yield found
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


def test_without_the_module_the_version_is_refused():
    with pytest.raises(TpplanError, match="no engine data for that version"):
        engines.select("vllm@0.99.0")


def test_docs_engines_md_gains_its_section(with_fake_release):
    from tpplan.engines.doc import render

    doc = render()
    assert "## `vllm@0.99.0`: a made-up release for a test" in doc
    assert "0.99.0 (made up for a test)" in doc


def test_a_recipe_names_the_new_version(with_fake_release):
    from tpplan.engines.recipes import recipes
    from tpplan.mesh import Mesh
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-qwen3"))
    out = recipes(make_plan("baseline", graph, 2), graph.spec, Mesh(2), engines=engines.select_pair(["vllm@0.99.0"]))
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
