"""Decision rules: --current parsing, provenance bands, crossings, and the bottom line."""

from __future__ import annotations

import pytest
from cli_helpers import run_in_process

from tpplan.cost.provenance import BANDS, provenance, within_band
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.report.analysis import analyse
from tpplan.report.crossover import crossing
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.memo_variants import parse_current
from tpplan.search.grid import MeshAsk


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("baseline", ("baseline", None, 1)),
        ("ep4", ("ep4", None, 1)),
        ("TP32+EP4", ("ep4", 32, 1)),
        ("TP32 with EP4", ("ep4", 32, 1)),
        ("tp32 ep4", ("ep4", 32, 1)),
        ("sp-moe TP8xPP4", ("sp-moe", 8, 4)),
        ("TP8xPP4", ("baseline", 8, 4)),
        ("input-scattered+restore+ep4", ("input-scattered+restore+ep4", None, 1)),
    ],
)
def test_parse_current(text, expected):
    assert parse_current(text) == expected


def test_bad_current_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    out = tmp_path / "memo"
    for bad, why in (("TP64", "needs 64 GPUs"), ("warp-drive", "unknown plan")):
        code, err = run_in_process(monkeypatch, capsys, "report", "-m", "tiny-kimi-k3", "-t", "h200x2", "--current",
                                   bad, "--out", str(out))  # fmt: skip
        assert code == 2 and why in err and "--current" in err and "Traceback" not in err
        assert not out.exists()


def test_provenance_follows_the_topology():
    assert provenance(load_topology("h200x2-runtime-kernels"), 2) is BANDS["calibrated"]
    assert provenance(load_topology("h200x2-runtime-kernels"), 4) is BANDS["datasheet"]  # beyond the fitted group
    assert provenance(load_topology("h200x2-calibrated"), 2) is BANDS["datasheet"]  # collectives only
    assert provenance(load_topology("pcie8-rtxpro6000"), 32) is BANDS["datasheet"]
    assert within_band(0.10, 0.139) and within_band(-0.139, 0.139) and not within_band(0.14, 0.139)


def test_crossing_interpolates_in_log_tokens():
    grid = (1024, 2048, 4096, 8192)
    c = crossing("p", "k", grid, [4.0, 3.0, 2.0, 3.0], [2.0, 3.5, 3.0, 2.0])
    # faster between 1024 and 2048 (diff -2 -> +0.5: 80% of the way in log) and stops between 4096 and 8192
    assert c.overtakes_at == pytest.approx(2 ** (10 + 0.8))
    assert c.stops_at == pytest.approx(2 ** (12 + 0.5))
    assert c.describe().startswith("faster from 1,783 to 5,793 tokens")
    never = crossing("p", "k", grid, [2.0] * 4, [1.0] * 4)
    assert not never.ever_faster and never.describe().startswith("never faster")
    always = crossing("p", "k", grid, [1.0] * 4, [2.0] * 4)
    assert always.faster_at_start and always.stops_at is None and always.describe().startswith("always")


def test_calibrated_band_makes_small_gains_count():
    """The same prediction is judged with the band of its provenance: in-sample 2.1%, datasheet 13.9%."""
    wl = [load_workload("seed-c8")]
    cal = analyse(
        "tiny-kimi-k3", load_topology("h200x2-runtime-kernels"), wl, MemoAsk(deployment=MeshAsk(tp=2), search_top=0)
    )
    assert cal.provenance is BANDS["calibrated"]
    judged = 0
    for v, vd in zip(cal.variants, cal.verdicts, strict=True):
        if v is cal.current or not v.legal:
            continue
        t, t0 = (next(iter(x.predictions.values())).ttft.mean_s for x in (v, cal.current))
        gain = (t0 - t) / t0
        assert (vd.status == "TOO CLOSE") == (abs(gain) <= 0.021), (v.key, gain, vd.status)
        assert (vd.status == "NO") == (gain < -0.021), (v.key, gain, vd.status)
        judged += 1
    assert judged >= 4


def test_keep_when_today_is_the_best():
    """Judged against the predicted best, nothing beats it: the bottom line keeps it, with no step."""
    topo = load_topology("h200x8-ib400", nodes=4)
    a = analyse(
        "kimi-k3",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(expert_dtype="mxfp4", current="sp-moe TP8xPP4", search_top=0),
    )
    assert a.current.key == "sp-moe TP8xPP4" and not a.next_steps
    assert a.bottom is not None and a.bottom.action == "keep" and "**Keep `sp-moe TP8xPP4`**" in a.bottom.text


def test_unknown_plan_in_current_raises():
    with pytest.raises(TpplanError, match="--current"):
        analyse(
            "tiny-kimi-k3",
            load_topology("h200x2"),
            [load_workload("seed-c8")],
            MemoAsk(deployment=MeshAsk(tp=2), current="nope", search_top=0),
            use_default_predictor=False,
        )


def test_without_a_predictor_weights_that_do_not_fit_are_no():
    """Issue 10: no memory prediction, but the audit's weights alone exceed the GPU: never YES, never a step."""
    topo = load_topology("h200x8-ib400", nodes=1)
    a = analyse(
        "deepseek-v3",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=2), search_top=0),
        use_default_predictor=False,
    )
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        if v is not a.current:
            assert v.audit.weight_bytes_per_rank > 140 * 2**30 and vd.status == "NO", (v.key, vd.status)
            assert "does not fit in GPU memory" in vd.headline or not v.legal
    assert not a.next_steps and a.bottom.action == "keep"
