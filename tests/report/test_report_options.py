"""Issue 33, item 3: `tpplan report` takes every deployment option `tpplan search` takes, and prices CP as
the engines run it unless tpplan's own KV accounting is asked for."""

from __future__ import annotations

import typer

from tpplan.cli import app

# search options that are not about the deployment, each with why the memo has none of its own
NOT_DEPLOYMENT = {
    "--top": "the memo shows the search's best; its tables rank every deployment",
    "--json": "the memo is markdown and HTML (--out)",
    "--save": "plans are saved by search; the memo reads one with --plan",
    "--tokens": "the memo always has workloads (-w); --tokens is search's batch without one",
    "--objective": "the memo ranks by predicted time, search's default objective",
    "--all": "the memo takes the search's best of each family, search's default mode",
    "--wide": "a terminal-table width switch",
    # the workload's arrivals for search's serving block (the engine's loop, tpplan.simulate); not a deployment
    # option, and the memo has no serving section yet
    "--arrival-rate": "arrivals, not the deployment (search's serving block)",
    "--trace": "arrivals, not the deployment (search's serving block)",
    "--requests": "arrivals, not the deployment (search's serving block)",
    "--seed": "arrivals, not the deployment (search's serving block)",
}


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


def _cp_analysis(**kw):
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import load_workload
    from tpplan.report.analysis import analyse

    topo = load_topology("h200x2")
    return analyse("tiny-llama", topo, [load_workload("prompt16k-c8")], tp=1, cp=2, prompt_lengths=None, **kw)


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
