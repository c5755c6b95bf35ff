"""The bench results file (docs/bench-json.md): parsing, clear errors, and its use in the memo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from tpplan.bench_results import error_summary, load_bench_results, parse_bench_results
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk

FIX = Path(__file__).parent / "fixtures"


def _ok() -> dict:
    return json.loads((FIX / "bench_ok.json").read_text())


def test_parses_the_fixture():
    r = load_bench_results(FIX / "bench_ok.json")
    assert r.plan == "baseline" and r.tp == 2 and r.meta.gpus == 2
    assert r.collectives[0].bytes == 8192 * 7168 * 2 and r.collectives[0].direct_s == pytest.approx(0.000447)
    assert r.collectives[2].rel_error is None  # no prediction given
    assert r.collectives[0].rel_error == pytest.approx((0.000431 - 0.000452) / 0.000452)
    s = error_summary(list(r.collectives))
    assert s["n"] == 2 and s["max_abs_err"] == pytest.approx(0.011 / 0.139, rel=1e-6)
    assert r.model_slice.layer_kinds == {"mla+moe": 1, "kda+moe": 3}


def _mutate(path, value):
    data = _ok()
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("schema_version",), 3, "schema_version"),
        (("schema_version",), True, "schema_version"),
        (("meta", "date"), "yesterday", "meta.date"),
        (("meta", "command"), KeyError, "meta.command"),
        (("collectives", 0, "measured_s"), -1.0, "collectives.0.measured_s"),
        (("collectives", 0, "kind"), "broadcast", "collectives.0.kind"),
        (("collectives", 1, "shape"), [], "collectives.1.shape"),
        (("ops", 0, "colour"), "red", "ops.0.colour"),
        (("tp",), 0, "tp"),
    ],
)
def test_bad_fields_name_the_field(path, value, field):
    with pytest.raises(TpplanError) as exc:
        parse_bench_results(_mutate(path, value), "r.json")
    assert f"r.json: {field}" in str(exc.value)


def test_empty_measurements_and_non_objects():
    data = _ok()
    for k in ("collectives", "ops", "layers", "batches"):
        data[k] = []
    with pytest.raises(TpplanError, match="no measurements"):
        parse_bench_results(data)
    with pytest.raises(TpplanError, match="not a JSON object"):
        parse_bench_results([1, 2])


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(TpplanError, match="no such file"):
        load_bench_results(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "meta": {')
    with pytest.raises(TpplanError, match="malformed JSON"):
        load_bench_results(bad)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TpplanError, match=r"not UTF-8"):
        load_bench_results(binary)


@pytest.mark.parametrize("kind", ["missing", "corrupt", "schema"])
def test_cli_bad_bench_exits_2_without_output(tmp_path, monkeypatch, capsys, kind):
    bench = tmp_path / "bench.json"
    if kind == "corrupt":
        bench.write_text("{not json")
    elif kind == "schema":
        bench.write_text(json.dumps(_mutate(("meta", "gpus"), "two")))
    out = tmp_path / "memo"
    code, err = run_in_process(monkeypatch, capsys, "report", "-m", "kimi-k3", "--bench", str(bench), "--out", str(out))
    assert code == 2 and "Traceback" not in err
    assert "--bench" in err or "bench.json" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".memo")]


def test_memo_shows_measured_vs_predicted():
    topo = load_topology("h200x8-ib400", nodes=4)
    a = analyse(
        "kimi-k3",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(bench=load_bench_results(FIX / "bench_ok.json"), search_top=0),
        use_default_predictor=False,
    )
    memo = build_memo(a)
    assert "predicted_vs_measured.png" in memo.pngs
    md = memo.markdown
    assert "## Measured against predicted" in md
    assert "| collective | 3 | 2 | 6.3% | 7.9% | median <= 5% |" in md
    assert (
        "torch.distributed (1 measured): median +1.1%, worst +1.1% (target: at most +3%)" in md
        and "| AG qkv_latent[2112] | 4096x2112 | 34,603,008 |" in md
    )
    assert "not a serving engine): mean 2.910 s (predicted 2.850 s)" in md


def test_memo_bench_section_names_what_priced_the_run(tmp_path):
    """Issue 34: the section said "roofline kernel estimates" for any run without kernel profiles; it now
    names the sources the file's ops record and the band composed from them."""
    data = _ok()
    data["topology"] = "h200-serving"
    for o in data["ops"]:
        o["source"] = "kernel-model"
    bench = parse_bench_results(data)
    topo = load_topology("h200x8-ib400", nodes=4)
    a = analyse(
        "kimi-k3", topo, [load_workload("seed-c8")], MemoAsk(bench=bench, search_top=0), use_default_predictor=False
    )
    md = build_memo(a).markdown
    assert "roofline" not in md.split("## Measured against predicted", 1)[1].split("\n\n", 2)[1]
    assert "(predictions: ops priced by physical kernel models 100% (out-of-sample band composed" in md
