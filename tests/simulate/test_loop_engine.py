"""`--engine` picks the serving loop's engine (`cost.pipeline.loop_engine`): audit, search and report serve
with vLLM 0.34.0's loop and flags under `--engine vllm@0.34.0`; under `--engine trtllm` (no serving rules read)
the default engine's loop, and the output says so in one line. `--router` is checked against that engine."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli
from tests.simulate.test_speculative import EAGLE3
from tpplan.cost.draft import eagle3_draft
from tpplan.cost.pipeline import DEFAULT_PP_ENGINE, loop_engine, loop_note
from tpplan.engines import default_release
from tpplan.engines.speculative import Speculative, launch_flags

VLLM = "vllm@0.34.0"
MODEL = ("-m", "tiny-deepseek-v3", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline")


def _trace(tmp_path) -> str:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,33\n0.001,256,21\n")
    return str(trace)


def test_the_loop_is_the_named_engines_where_tpplan_read_its_rules() -> None:
    assert DEFAULT_PP_ENGINE.startswith("sglang@")
    assert loop_engine(None) == DEFAULT_PP_ENGINE and loop_engine("trtllm") == DEFAULT_PP_ENGINE
    assert loop_engine(VLLM) == VLLM and loop_engine("vllm") == default_release("vLLM").key
    assert loop_engine("vllm@0.33.0") == "vllm@0.33.0"
    assert loop_engine("vllm@0.24.0") == default_release("vLLM").key  # a kernel-database-only version
    assert loop_note(None) == loop_note(VLLM) == loop_note("vllm") == loop_note("sglang") == ""
    assert "no serving rules for trtllm" in loop_note("trtllm") and DEFAULT_PP_ENGINE in loop_note("trtllm")


def test_audit_with_vllm_serves_vllms_loop_and_flags(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, "audit", *MODEL, "--engine", VLLM, "--trace", _trace(tmp_path),
                             "--spec", "mtp:3:2", "--json", "-")  # fmt: skip
    assert code == 0, err
    s = json.loads(out)["plans"][0]["serving"]
    assert s["engine"] == VLLM
    flags = s["decode"]["settings"]["speculative"]["flags"]
    assert flags == ["""--speculative-config '{"method":"mtp","num_speculative_tokens":3}'"""]
    assert not any("no serving rules" in c for c in s["conditions"])


def test_audit_with_trtllm_keeps_the_default_loop_and_says_so(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, "audit", *MODEL, "--engine", "trtllm", "--trace", _trace(tmp_path),
                             "--spec", "mtp:3:2", "--json", "-")  # fmt: skip
    assert code == 0, err
    s = json.loads(out)["plans"][0]["serving"]
    assert s["engine"] == DEFAULT_PP_ENGINE
    assert s["decode"]["settings"]["speculative"]["flags"][0] == "--speculative-algorithm NEXTN"
    assert [c for c in s["conditions"] if "no serving rules" in c] == [loop_note("trtllm")]


def test_search_with_vllm_serves_vllms_loop(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, "search", "-m", "tiny-deepseek-v3", "--tp", "2", "-t",
                             "h200x8-ib400", "--engine", VLLM, "--trace", _trace(tmp_path), "--spec", "mtp:3:2",
                             "--top", "1", "--json", "-")  # fmt: skip
    assert code == 0, err
    served = [p["serving"] for p in json.loads(out)["plans"] if p.get("serving")]
    assert served and {s["engine"] for s in served} == {VLLM}
    assert all("--speculative-config" in s["decode"]["settings"]["speculative"]["flags"][0] for s in served)


def test_report_with_vllm_serves_vllms_loop(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "memo.json"
    code, _, err = run_cli(monkeypatch, capsys, "report", "-m", "tiny-deepseek-v3", "--tp", "2", "-t",
                           "h200x8-ib400", "--engine", VLLM, "--trace", _trace(tmp_path), "--spec", "mtp:3:2",
                           "--json", str(target), "--out", str(tmp_path / "memo"))  # fmt: skip
    assert code == 0, err
    memo = json.loads(target.read_text())
    served = [c["serving"] for c in memo["chosen"] if c.get("serving")]
    assert memo["pp_engine"] == VLLM and served and {s["engine"] for s in served} == {VLLM}


@pytest.mark.parametrize(
    ("engine", "router", "ok"),
    [(VLLM, "dp:least_loaded", True), (VLLM, "sglang-router:cache_aware", False), (None, "dp:least_loaded", False)],
)
def test_the_router_is_the_loop_engines(monkeypatch, capsys, engine, router, ok) -> None:  # type: ignore[no-untyped-def]
    extra = ("--engine", engine) if engine else ()
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--topology", "h100x8-ib400",
                             "--tp", "2", "--replicas", "2", "--router", router, *extra)  # fmt: skip
    assert (code == 0) == ok, err
    if not ok:
        assert code == 2 and out == "" and err.count("\n") == 1 and f"--router {router}" in err
        assert (engine or DEFAULT_PP_ENGINE) in err


def test_an_eagle3_draft_gets_each_engines_eagle3_method(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM 0.34.0 names an EAGLE-3 draft's method 'eagle3' (transformers_utils/configs/eagle.py), SGLang 0.5.23
    its algorithm EAGLE3 (the target captures the auxiliary hidden states only under it)."""
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3))
    (tmp_path / "eagle1").mkdir()
    (tmp_path / "eagle1" / "config.json").write_text(json.dumps({**EAGLE3, "architectures": ["LlamaForCausalLM"]}))
    three = Speculative(3, 2.0, method="eagle", draft_model=str(tmp_path))
    one = Speculative(3, 2.0, method="eagle", draft_model=str(tmp_path / "eagle1"))
    assert eagle3_draft(three) and not eagle3_draft(one) and not eagle3_draft(Speculative(3, 2.0))
    assert eagle3_draft(Speculative(3, 2.0, method="eagle", draft_model="org/EAGLE3-llama"))  # vLLM's name test
    assert not eagle3_draft(Speculative(3, 2.0, method="eagle", draft_model="org/eagle-llama"))
    assert '"method":"eagle3"' in launch_flags(VLLM, three, eagle3=True)[0]
    assert '"method":"eagle"' in launch_flags(VLLM, one)[0]
    assert launch_flags("sglang@0.5.23", three, eagle3=True)[0] == "--speculative-algorithm EAGLE3"
    assert launch_flags("sglang@0.5.23", one)[0] == "--speculative-algorithm EAGLE"
    assert launch_flags("sglang@0.5.23", Speculative(3, 2.0), eagle3=True)[0] == "--speculative-algorithm NEXTN"


def test_audit_launches_an_eagle3_draft_as_eagle3(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3))
    code, out, err = run_cli(monkeypatch, capsys, "audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400",
                             "--plan", "baseline", "--engine", VLLM, "--trace", _trace(tmp_path), "--spec",
                             f"eagle:3:2:{tmp_path}", "--json", "-")  # fmt: skip
    assert code == 0, err
    spec = json.loads(out)["plans"][0]["serving"]["decode"]["settings"]["speculative"]
    assert '"method":"eagle3"' in spec["flags"][0]
    assert any("configs/eagle.py" in s for s in spec["sources"])
