"""`tpplan report`: the memo's structure and numbers, the seed's conclusion, bad inputs, atomic output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from tpplan.bench_results import load_bench_results
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import Topology, load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.report import writer
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk

FIX = Path(__file__).parent / "fixtures"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpplan", *args], capture_output=True, text=True)


def roomy(topo):
    """The same cluster with 256 GiB GPUs: K3's bf16 weights (172-220 GiB per rank at TP32) fit, so the
    volume-only memo has plans to compare (on 140 GiB H200s nothing fits in bf16: every plan is NO)."""
    data = topo.model_dump()
    data["gpu"] = {**data["gpu"], "memory_GiB": 256.0}
    return Topology.model_validate(data)


@pytest.fixture(scope="module")
def k3_4x8():
    topo = roomy(load_topology("h200x8-ib400", nodes=4))
    wls = [load_workload("seed-c8"), load_workload("seed-c16")]
    return analyse("kimi-k3", topo, wls, MemoAsk(deployment=MeshAsk(tp=32), search_top=0), use_default_predictor=False)


@pytest.fixture(scope="module")
def k3_md(k3_4x8) -> str:
    return build_memo(k3_4x8).markdown


def _section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    nxt = md.find("\n## ", start + 3)
    return md[start : nxt if nxt > 0 else len(md)]


def test_structure(k3_md):
    for title in (
        "Answer",
        "Verdict per plan",
        "The seed's table, re-derived from the model graph",
        "Volume per plan versus TP size",
        "Time per layer kind per plan",
        "TTFT per plan",
        "Where tpplan's model differs from the seed's hand analysis",
        "Next steps, ranked by predicted gain",
        "Engine flags",
    ):
        assert f"\n## {title}\n" in k3_md, title
    assert "![bytes per token per rank against TP size" in k3_md
    assert "needs the time predictor" in k3_md  # the boundary is stated, not hidden


def test_seed_table_numbers_at_tp32(k3_md):
    table = _section(k3_md, "The seed's table, re-derived from the model graph")
    rows = {r.split("|")[4].strip(): r for r in table.splitlines() if r.startswith("| ") and "`" in r}
    assert "| 14336 | `baseline` | 14336 | +0.0% | yes |" in rows["`baseline`"]
    assert "| 9280 | `input-scattered` | 9280 | -35.3% | NO |" in rows["`input-scattered`"]
    assert "| 16448 | `latent-scattered` | 16448 | +14.7% | yes |" in rows["`latent-scattered`"]
    assert "| 16448 | `input-scattered+restore` | 16448 | +14.7% | yes |" in rows["`input-scattered+restore`"]
    assert "`RS(delta 7168) + AG(qkv_latent 2112) = 7168 + 2112 = 9280`" in table


def test_rederives_the_seed_conclusion(k3_4x8, k3_md):
    answer = _section(k3_md, "Answer")
    assert "**No**" in answer and "g_proj" in answer
    assert "**Keep `baseline` until plans are timed**" in answer  # no predictor here: bytes do not decide
    assert "each rank owns 3 of 96 heads/columns (a [384, 7168] slice of the weight)" in answer
    assert "the all-reduce (`baseline`) costs 14336; `input-scattered` 9280 (-35.3%, illegal here)" in answer
    assert "`input-scattered+restore` 16448 (+14.7%, legal here); `latent-scattered` 16448 (+14.7%" in answer
    verdicts = {v.key: v for v in k3_4x8.verdicts}
    assert verdicts["input-scattered"].status == "NO"
    assert verdicts["latent-scattered"].status == "NO"  # the prototype: +14.7% per MLA layer
    assert verdicts["input-scattered+restore"].status == "NO"
    reasons = " ".join(verdicts["input-scattered"].reasons)
    assert "[kda+dense, kda+moe, mla+moe] g_proj receives `x` S(tok) but needs R: it is column-parallel" in reasons
    assert "replicate g_proj (162.8 MiB more weight per rank)" in reasons
    # The seed's next steps come out on top: MoE all-to-all first, gate-aware only with its price.
    steps = [s.key for s in k3_4x8.next_steps]
    assert steps[0] == "sp-moe" and "gate-aware" in steps
    assert not {"input-scattered", "latent-scattered", "input-scattered+restore"} & set(steps)


def test_differences_carry_numbers(k3_4x8, k3_md):
    diff = _section(k3_md, "Where tpplan's model differs from the seed's hand analysis")
    for title in ("Redundant qkv_a compute", "gate-aware plan: price and gain", "MoE all-to-all", "Pipeline"):
        assert title in diff
    assert "[8192, 7168] x [7168, 2112]" in diff
    assert "+48.0 GiB of replicated weights per rank" in diff and "-14.4% bytes" in diff
    assert re.search(r"moves -5\d\.\d% bytes per token per rank vs `baseline` at TP32", diff)
    assert "TP8 x PP4" in diff


def test_engine_flags_in_memo(k3_md):
    eng = _section(k3_md, "Engine flags")
    assert "--enable-attn-tp-input-scattered" in eng and "--moe-a2a-backend deepep" in eng
    assert "--enable-expert-parallel --all2all-backend deepep_high_throughput" in eng
    assert "--tp-size 8 --pp-size 4" in eng and "--pipeline-parallel-size 4" in eng
    assert "input-scattered+restore" in eng
    # SGLang never enters input-scattered on K3 (kimi_k3.py): the memo says so, with the source
    assert "does not wire --enable-attn-tp-input-scattered for kimi_k3" in eng and "kimi_k3.py" in eng
    assert "Pipeline parallelism as the engines schedule it" in eng and "scheduler_pp_mixin.py" in eng


def test_volume_vs_tp_table(k3_4x8):
    sweep = dict(k3_4x8.volume_vs_tp)
    assert [n for n, _ in sweep["baseline"]] == [2, 4, 8, 16, 32]
    assert dict(sweep["baseline"])[32] == 6471808.0


def test_with_predictions_time_and_ttft_sections():
    topo = roomy(load_topology("h200x8-ib400", nodes=4))
    wls = [load_workload("seed-c8"), load_workload("seed-c16")]
    a = analyse("kimi-k3", topo, wls, MemoAsk(deployment=MeshAsk(tp=32), search_top=0), predictor=predict_plan)
    memo = build_memo(a)
    assert {"volume_vs_tp.png", "time_per_layer_kind.png", "ttft.png", "crossover.png"} <= set(memo.pngs)
    assert "## Thresholds: where a plan overtakes baseline" in memo.markdown
    ttft = _section(memo.markdown, "TTFT per plan")
    assert "| `baseline` | prompt16k-c8 |" in ttft and "| `baseline` | prompt16k-c16 |" in ttft
    assert "predicted mean TTFT gain at prompt16k-c8" in memo.markdown
    assert "The time predictor counts" in memo.markdown
    pp = a.variant("baseline TP8xPP4")
    assert pp is not None and pp.predictions and "pipeline send/recv" in memo.markdown
    assert a.predictor_note is None


@pytest.mark.slow
def test_cli_writes_all_files(tmp_path):
    out = tmp_path / "memo"
    r = run("report", "--model", "kimi-k3", "--topology", "h200x8-ib400", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.html", "volume_vs_tp.png"}
    html = (out / "report.html").read_text()
    assert "<script" not in html and not re.search(r"(src|href)=\"https?:", html)
    assert html.count("data:image/png;base64,") == len(list(out.glob("*.png")))
    assert [p for p in tmp_path.iterdir()] == [out]  # no temp dirs left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "no-such-model"), "no-such-model"),
        (("--topology", "no-such-topo"), "no such preset or file"),
        (("--workload", "no-such-wl"), "no such preset or file"),
        (("--nodes", "4", "--tp", "64"), "only 32 GPUs"),
        (("--plan", "no-such-plan"), "unknown plan"),
        (("--expert-dtype", "int3"), "unknown weight dtype"),
    ],
)
def test_bad_inputs_exit_2_and_leave_nothing(tmp_path, monkeypatch, capsys, args, message):
    out = tmp_path / "memo"
    code, err = run_in_process(monkeypatch, capsys, "report", "--out", str(out), "--model", "kimi-k3", *args)
    assert code == 2, err
    assert message in err.replace("\n", " ") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_bad_input_exit_code_of_the_real_process(tmp_path):
    r = run("report", "--model", "no-such-model", "--out", str(tmp_path / "memo"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_dir_and_keeps_an_old_report(tmp_path, k3_4x8, monkeypatch):
    memo = build_memo(k3_4x8)
    out = tmp_path / "memo"
    writer.write_memo(memo, out)
    before = (out / "report.md").read_text()

    class Boom(Exception):
        pass

    def bad_write_bytes(self, data):
        raise Boom("disk full")

    monkeypatch.setattr(Path, "write_bytes", bad_write_bytes)
    with pytest.raises(Boom):
        writer.write_memo(memo, out)
    assert (out / "report.md").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memo"]
    fresh = tmp_path / "fresh"
    with pytest.raises(Boom):
        writer.write_memo(memo, fresh)
    assert not fresh.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["memo"]


def test_out_must_be_a_directory(tmp_path, k3_4x8):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TpplanError, match="not a directory"):
        writer.write_memo(build_memo(k3_4x8), f)


def test_other_models_render():
    topo = roomy(load_topology("h200x8-ib400", nodes=1))
    wls = [load_workload("seed-c8")]
    a = analyse("deepseek-v3", topo, wls, MemoAsk(deployment=MeshAsk(tp=8), search_top=0), use_default_predictor=False)
    md = build_memo(a).markdown
    assert {v.key: v.status for v in a.verdicts}["input-scattered"] != "NO"  # legal on DeepSeek (no gate)
    assert "input-scattered" in md and "TP8xPP" not in md  # one node: no pipeline variant
    a2 = analyse("tiny-llama", topo, wls, MemoAsk(deployment=MeshAsk(tp=2), search_top=0), use_default_predictor=False)
    md2 = build_memo(a2).markdown
    assert "The seed's table" not in md2 and "MLA layer's attention input" not in md2  # no MLA latent: no table


def test_with_the_real_predictor_the_seed_conclusion_holds():
    """With tpplan.cost.predict: time and memory join the verdicts; the seed's "no" still stands."""
    pytest.importorskip("tpplan.cost.predict")
    topo = load_topology("h200x8-ib400", nodes=4)
    wls = [load_workload("seed-c8"), load_workload("seed-c16")]
    a = analyse("kimi-k3", topo, wls, MemoAsk(deployment=MeshAsk(tp=32), expert_dtype="mxfp4"))
    assert a.predictor_note is None
    verdicts = {v.key: v.status for v in a.verdicts}
    assert verdicts["input-scattered"] == "NO"  # illegal
    # The legal variants are slower or within the band: never a YES.
    assert {verdicts["latent-scattered"], verdicts["input-scattered+restore"]} <= {"NO", "TOO CLOSE"}
    steps = [s.key for s in a.next_steps if s.clear]  # gains beyond the error band
    assert steps and not {"input-scattered", "latent-scattered", "input-scattered+restore"} & set(steps)
    assert all("TTFT" in s.basis for s in a.next_steps)
    runnable = [s.key for s in a.next_steps if s.clear and s.engine_ok]  # the switch goes to what an engine runs
    assert a.bottom is not None and a.bottom.action == "switch" and a.bottom.target == runnable[0]
    md = build_memo(a).markdown
    assert "The time predictor counts" in md and "| `sp-moe TP8xPP4` | prompt16k-c16 |" in md
    found = [v for v in a.variants if v.plan.found_by == "search"]
    if found:  # the search's best, when it is not a named plan: legal, described, compared
        assert found[0].legal and "### A plan nobody named" in md and f"`{found[0].key}`" in md


DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLE_BENCH = "docs/benchmarks/h200x2-2026-11-30-kernel-profiles/k3-baseline.json"
SEED = ("seed-c8", "seed-c16")
EXAMPLES = {  # directory -> (command, topology, bench file, workloads)
    "kimi-k3-4x8": (
        "tpplan report --model kimi-k3 --topology h200x8-ib400 --nodes 4 --expert-dtype mxfp4 --current TP32+EP4 "
        f"--bench {EXAMPLE_BENCH} --out docs/examples/kimi-k3-4x8",
        "h200x8-ib400",
        EXAMPLE_BENCH,
        SEED,
    ),
    "kimi-k3-pcie4x8": (
        "tpplan report --model kimi-k3 --topology pcie8-rtxpro6000 --nodes 4 --expert-dtype mxfp4 --current TP32+EP4 "
        "--out docs/examples/kimi-k3-pcie4x8",
        "pcie8-rtxpro6000",
        None,
        SEED,
    ),
    "kimi-k3-4x8-long": (
        "tpplan report --model kimi-k3 --topology h200x8-ib400 --nodes 4 --expert-dtype mxfp4 --current TP32+EP4 "
        "-w prompt16k-c8 -w prompt128k-c4 --out docs/examples/kimi-k3-4x8-long",
        "h200x8-ib400",
        None,
        ("prompt16k-c8", "prompt128k-c4"),
    ),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.slow
def test_checked_in_example_is_current(name):
    """docs/examples/<name>/report.md is what its documented command writes today."""
    pytest.importorskip("tpplan.cost.predict")
    cmd, topology, bench_file, workloads = EXAMPLES[name]
    topo = load_topology(topology, nodes=4)
    wls = [load_workload(w) for w in workloads]
    bench = load_bench_results(str(DOCS.parent / bench_file)) if bench_file else None
    a = analyse("kimi-k3", topo, wls, MemoAsk(expert_dtype="mxfp4", current="TP32+EP4", bench=bench))
    md = build_memo(a, cmd).markdown
    assert md == (DOCS / "examples" / name / "report.md").read_text(), f"stale example: run `{cmd}`"
    assert cmd in (DOCS / "examples" / "README.md").read_text()
    if name == "kimi-k3-4x8":
        assert cmd in (DOCS.parent / "README.md").read_text()
    # The seed's cluster has never been measured: its numbers say so.
    if topology.startswith("pcie"):
        assert "extrapolated from datasheet figures" in md and "calibrated on this machine" not in md.split("## How")[0]


@pytest.mark.parametrize("measured_s", [None, 1.02, 3.0])
def test_bench_ttft_is_compared_with_the_memos_prediction(measured_s):
    """The bench section says whether the bench's extrapolated TTFT and the memo's prediction for the
    same target agree within the memo's band; the quoted gap and the verdict follow the numbers."""
    from tpplan.report.bench_section import memo_vs_bench_ttft

    topo = load_topology("h200x2")
    bench = load_bench_results(Path(__file__).parent / "fixtures" / "bench_ok.json")
    a = analyse(
        "tiny-llama",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=2), bench=bench, search_top=0),
        predictor=predict_plan,
    )
    base = next(v for v in a.variants if v.plan.name == "baseline" and v.tp == 2)
    memo_s = base.predictions["prompt16k-c8"].ttft.mean_s
    t = bench.ttft[0].model_copy(update={"topology": "h200x2 (TP2)", "mean_s": memo_s * (measured_s or 1.0)})
    text = memo_vs_bench_ttft(a, t)
    gap = t.mean_s / memo_s - 1.0
    assert f"{100 * gap:+.1f}%" in text
    assert ("they agree" in text) == (abs(gap) <= a.provenance.band)
    assert ("they differ" in text) == (abs(gap) > a.provenance.band)
    other = t.model_copy(update={"topology": "h200x8-ib400 x4 nodes (TP32)"})
    assert memo_vs_bench_ttft(a, other) == ""  # not a target the memo predicts: no comparison
    # Files since 2026-12-01 name the target in fields; those decide, whatever the text says.
    same = t.model_copy(update={"topology": "anything", "target": "h200x2", "nodes": 1, "tp": 2})
    assert memo_vs_bench_ttft(a, same) == text
    for wrong in ({"nodes": 2}, {"tp": 1}, {"target": "h200x8-ib400"}):
        assert memo_vs_bench_ttft(a, same.model_copy(update=wrong)) == "", wrong


def test_memo_names_the_extrapolated_kernel_shapes():
    """A memo on a topology with physical kernel models names the ops they priced outside their
    measured shapes, with the count the predictions carry, also in "How sure"; on a GPU model without kernel
    models only GEMMs below the GEMM table's shapes are."""
    topo = load_topology("h200-kernel-models")
    a = analyse(
        "tiny-kimi-k3",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=1), search_top=0),
        predictor=predict_plan,
    )
    ops = {op for v in a.variants for p in v.predictions.values() for op in p.extrapolated_ops}
    md = build_memo(a).markdown
    assert ops, "tiny K3 on the H200 kernel models should leave the measured shapes somewhere"
    assert f"{len(ops)} op(s) were priced outside the shapes their measurements cover" in md
    assert f"Extrapolated: {len(ops)} op(s) of the plans compared" in md  # counted in "How sure" too
    b = analyse(
        "tiny-kimi-k3",
        load_topology("h200x2"),
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=2), search_top=0),
        predictor=predict_plan,
    )
    b_ops = [o for v in b.variants for p in v.predictions.values() for k in p.kinds for o in k.ops if o.extrapolated]
    assert b_ops and all(o.category in ("gemm", "moe") and o.source == "gemm-table" for o in b_ops)  # GEMMs only


@pytest.mark.parametrize(("pass_ms", "word"), [(102.0, "within"), (110.0, "over")])
def test_memo_bench_section_reports_the_runtime_overhead_of_the_plans_own_run(pass_ms, word):
    """With `bench --overhead` results the memo quotes the GPU's idle share from the recorded pass and
    busy times, and its verdict against the 3% target follows the number."""
    from tpplan.bench_results import RuntimeOverhead

    topo = load_topology("h200x2")
    bench = load_bench_results(Path(__file__).parent / "fixtures" / "bench_ok.json")
    md0 = build_memo(
        analyse(
            "tiny-llama",
            topo,
            [load_workload("seed-c8")],
            MemoAsk(deployment=MeshAsk(tp=2), bench=bench, search_top=0),
            predictor=predict_plan,
        )
    ).markdown
    assert "GPU sat idle" not in md0
    ro = RuntimeOverhead(pass_s=pass_ms / 1e3, busy_s=0.1, kernels=321)
    bench = bench.model_copy(update={"runtime_overhead": ro})
    md = build_memo(
        analyse(
            "tiny-llama",
            topo,
            [load_workload("seed-c8")],
            MemoAsk(deployment=MeshAsk(tp=2), bench=bench, search_top=0),
            predictor=predict_plan,
        )
    ).markdown
    assert f"GPU sat idle {pass_ms - 100:.1f}% of a pass" in md
    assert f"{pass_ms:.1f} ms pass, 100.0 ms busy over 321 kernels" in md and f": {word} the target." in md
