"""Issue 33, item 3: `tpplan report` takes every deployment option `tpplan search` takes, and prices CP as
the engines run it unless tpplan's own KV accounting is asked for."""

from __future__ import annotations

import pytest
import typer

from tpplan.cli import app
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk

# search options that are not about the deployment, each with why the memo has none of its own
NOT_DEPLOYMENT = {
    "--top": "the memo shows the search's best; its tables rank every deployment",
    "--save": "plans are saved by search; the memo reads one with --plan",
    "--tokens": "the memo always has workloads (-w); --tokens is search's batch without one",
    "--objective": "the memo ranks by predicted time, search's default objective",
    "--all": "the memo takes the search's best of each family, search's default mode",
    "--wide": "a terminal-table width switch",
}
ARRIVAL_OPTIONS = ("--arrival-rate", "--trace", "--requests", "--seed")


def _options(name: str) -> dict[str, object]:
    cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt: p for p in cmd.params for opt in p.opts if opt.startswith("--")}


def test_report_takes_every_deployment_option_search_takes():
    search, report = _options("search"), _options("report")
    missing = set(search) - set(report) - set(NOT_DEPLOYMENT)
    assert not missing, f"tpplan report lacks search's deployment options {sorted(missing)}"
    assert set(NOT_DEPLOYMENT) <= set(search), "a listed option no longer exists in search"
    for opt in ("--pp", "--cp", "--cp-layers", "--cp-kv", "--dp-attention", "--replicas", "--overlap"):
        assert opt in report
    for opt in ("--overlap", "--cp-layers", "--cp-kv", "--pp", "--cp"):  # the same type and check in both
        s, r = search[opt], report[opt]
        assert s.type_descriptor.annotation is r.type_descriptor.annotation, opt  # type: ignore[attr-defined]
        assert getattr(s.callback, "__qualname__", None) == getattr(r.callback, "__qualname__", None), opt  # type: ignore[attr-defined]


def test_report_audit_and_search_take_the_same_arrival_options():
    """One definition (commands/_serving.py): the same type, default and help in all three commands."""
    cmds = {name: _options(name) for name in ("report", "audit", "search")}
    for opt in ARRIVAL_OPTIONS:
        got = {name: o[opt] for name, o in cmds.items() if opt in o}
        assert set(got) == set(cmds), f"{opt} only in {sorted(got)}"
        kinds = {(p.type_descriptor.annotation, p.default, p.help) for p in got.values()}  # type: ignore[attr-defined]
        assert len(kinds) == 1, (opt, kinds)


def test_memo_ranks_by_the_arrival_process_it_names():
    """A Poisson rate replaces each workload's closed loop in the memo's TTFTs and the memo says so."""
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import load_workload
    from tpplan.report.analysis import analyse
    from tpplan.report.memo import build_memo
    from tpplan.simulate.serving import Arrival

    def memo(arrival):
        a = analyse(
            "tiny-llama",
            load_topology("h200x2"),
            [load_workload("prompt16k-c8")],
            MemoAsk(deployment=MeshAsk(tp=2), arrival=arrival, search_top=0, prompt_lengths=None),
        )
        return a, build_memo(a).markdown

    closed, closed_text = memo(None)
    poisson, text = memo(Arrival(rate=0.5, requests=12, seed=3))
    assert "Poisson at 0.5 req/s, 12 requests, seed 3" in text and "Poisson" not in closed_text

    def ttfts(a):
        return {v.key: v.predictions["prompt16k-c8"].ttft.mean_s for v in a.variants if v.predictions}

    assert ttfts(closed).keys() == ttfts(poisson).keys() and ttfts(closed)
    assert all(ttfts(closed)[k] != ttfts(poisson)[k] for k in ttfts(closed))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--arrival-rate", "-1"), "--arrival-rate -1.0: must be a rate"),
        (("--arrival-rate", "2", "--trace", "t.jsonl"), "give one of them"),
        (("--requests", "0"), "--requests"),
    ],
)
def test_report_refuses_a_bad_arrival_before_any_work(tmp_path, monkeypatch, capsys, args, message):
    from tests.cli_helpers import run_in_process

    out = tmp_path / "memo"
    code, err = run_in_process(monkeypatch, capsys, "report", "--out", str(out), "--model", "tiny-llama",
                               "--topology", "h200x2", "--tp", "2", *args)  # fmt: skip
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert message in err and not out.exists()


def test_report_refuses_an_engine_it_cannot_launch_saying_why(tmp_path, monkeypatch, capsys):
    """The memo launches and judges SGLang and vLLM; TRT-LLM has kernel tables only. Before: 'no engine data
    for that version', of a version nobody gave."""
    from tests.cli_helpers import run_in_process

    out = tmp_path / "memo"
    code, err = run_in_process(monkeypatch, capsys, "report", "--out", str(out), "--model", "tiny-llama",
                               "--topology", "h200x8-ib400", "--tp", "2", "--engine", "trtllm")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    assert "--engine trtllm: tpplan has no launch flags or serving rules for trtllm. Fix: use sglang or vllm" in err


def _cp_analysis(cp_kv="engines"):
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import load_workload
    from tpplan.report.analysis import analyse

    topo = load_topology("h200x2")
    ask = MemoAsk(deployment=MeshAsk(tp=1, cp=2, cp_kv=cp_kv), prompt_lengths=None)
    return analyse("tiny-llama", topo, [load_workload("prompt16k-c8")], ask)


def test_cp_is_priced_as_the_engines_run_it_unless_asked():
    """Every CP rank keeps the whole sequence's KV by default (both engines do); `cp_kv="sharded"` is tpplan's
    own 1/CP, and the memo says which it used."""
    from tpplan.report.deployment_sections import cp_kv_sentence

    engines, sharded = _cp_analysis(), _cp_analysis(cp_kv="sharded")

    def kv(a):
        v = next(v for v in a.variants if v.cp == 2 and v.plan.name == "baseline")
        return v.predictions["prompt16k-c8"].memory.kv_cache

    assert kv(engines) == 2 * kv(sharded)
    assert "`--cp-kv engines`: every CP rank keeps the whole sequence's KV" in cp_kv_sentence(engines)
    assert "`--cp-kv sharded`: each CP rank keeps only its own tokens' KV" in cp_kv_sentence(sharded)


def test_the_price_of_a_switch_is_its_memory():
    """Each next step's price is its predicted memory per rank against today's and the card's, with its parts
    (before: "price: none" for 22.1 -> 70.9 GiB per rank on a 79.6 GiB card)."""
    from tpplan.units import gib

    a = _cp_analysis()
    assert a.next_steps
    ref = next(iter(a.current.predictions.values())).memory
    for s in a.next_steps:
        p = next(iter(a.variant(s.key).predictions.values()))
        m = p.memory
        assert s.price.startswith(f"memory per rank {gib(ref.total)} -> {gib(m.total)} of the card's "
                                  f"{gib(p.gpu_memory_bytes)} (weights {gib(m.weights)}")  # fmt: skip
        assert f"KV cache {gib(m.kv_cache)} for the workload's tokens" in s.price
        # the room left is the deciding engine's own KV pool in tokens and the decode batch it admits
        from tpplan.report.verdicts import deciding_engine

        e = deciding_engine(a.variant(s.key).engines)
        c = next(x for x in p.kv_capacity if e is not None and x.engine.startswith(e.engine.lower() + "@"))
        c0 = next(x for x in next(iter(a.current.predictions.values())).kv_capacity if x.engine == c.engine)
        assert f"{c.label} at its defaults sizes the KV pool to {c.tokens:,} tokens per rank ({c0.tokens:,} today)" in (
            s.price
        )
        assert f"a decode batch of {c.batch:,} requests of {c.seq_len:,} tokens ({c0.batch:,} today" in s.price
        assert "for more KV blocks" not in s.price
