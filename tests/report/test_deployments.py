"""The memo's deployment rows (issue 23): `tpplan report` searches `tpplan search`'s own TP x CP x PP
grid and names the same best deployment, a CP one included; its deployment ranking, reasons, engine
flags and prompt-length thresholds read true against the values beside them."""

from __future__ import annotations

import re
from functools import cache
from unittest.mock import patch

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.engines.launch import deployment_flags
from tpplan.mesh import Mesh
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.prompt_length import at_length
from tpplan.search import run_search
from tpplan.search.grid import MeshAsk

LENGTHS = (4096, 16384, 65536, 131072)
NUM = r"[-+]?[\d,]+(?:\.\d+)?"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@cache
def _memo(model: str, workload: str, cap: float | str | None = "serving", overlap: str | None = None):
    topo = load_topology("h200x2")
    a = analyse(
        model, topo, [load_workload(workload)], MemoAsk(memory_cap_gib=cap, overlap=overlap, prompt_lengths=LENGTHS)
    )
    from tpplan.report import plots

    names = ("volume_vs_tp", "stacked_time", "grouped_bars", "crossover", "predicted_vs_measured")
    with patch.multiple(plots, **{n: (lambda *args, **kw: b"") for n in names}):
        return a, build_memo(a).markdown


def _section(md: str, title: str) -> str:
    start = md.find(f"\n## {title}")
    assert start >= 0, title
    nxt = md.find("\n## ", start + 4)
    return md[start : nxt if nxt > 0 else len(md)]


def _table(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


@pytest.mark.parametrize(
    ("workload", "replicas", "winner"),
    [("prompt128k-c1", None, "TP1xCP2"), ("prompt16k-c8", None, "TP1xCP2"), ("prompt16k-c8", "all", "2x TP1")],
)
def test_search_and_report_name_the_same_best_deployment(workload, replicas, winner):
    """Both prompts make a CP deployment the search's best (under the serving loop SGLang's PP turns its
    overlap schedule off, so each PP step pays the scheduler's CPU, which a tiny model's steps do not
    hide), and, with replicas asked for (`--replicas all`, both commands), two replicas."""
    topo = load_topology("h200x2")
    best = run_search("tiny-deepseek-v3", topo, workload=load_workload(workload), top=1, replicas=replicas).ranked[0]
    assert best.deployment == winner, "the case needs this winner"
    if replicas is None:
        a, md = _memo("tiny-deepseek-v3", workload)
    else:
        a = analyse(
            "tiny-deepseek-v3",
            topo,
            [load_workload(workload)],
            MemoAsk(deployment=MeshAsk(replicas=replicas), prompt_lengths=None),
        )
        md = build_memo(a).markdown
    assert a.search_best is not None and a.search_best[1] == best.deployment
    v = next(v for v in a.variants if v.plan.name == a.search_best[0] and v.deployment == best.deployment)
    assert v.plan.describe() == best.plan.describe()
    assert v.predictions[workload].ttft.mean_s == pytest.approx(best.score, rel=1e-9)
    top = a.deployments[workload][0]
    assert top.rank == 1 and top.label == best.deployment  # the ranking's first row is the search's best
    assert f"ranks `{a.search_best[0]}` at `{best.deployment}` first" in md


def test_overlap_is_searched_only_when_asked_as_tpplan_search_does():
    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    plain = run_search("tiny-deepseek-v3", topo, workload=wl, top=1).ranked[0]
    dbo = run_search("tiny-deepseek-v3", topo, workload=wl, top=1, overlap="dbo").ranked[0]
    a_plain, _ = _memo("tiny-deepseek-v3", "prompt16k-c8")
    a_dbo, md = _memo("tiny-deepseek-v3", "prompt16k-c8", overlap="dbo")
    assert not any(v.plan.overlap for v in a_plain.variants)
    assert a_plain.search_best[1] == plain.deployment
    assert a_dbo.search_best == (a_dbo.search_best[0], dbo.deployment)
    assert (dbo.plan.overlap == "dbo") == a_dbo.search_best[0].endswith("+dbo")
    assert "micro-batch overlap `dbo` ranked too" in md
    rows = [r for r in a_dbo.deployments["prompt16k-c8"] if r.key[4] == "dbo"]
    assert rows, "an overlap row per deployment where an all-to-all plan runs"
    for r in rows:
        assert r.label.endswith("+dbo")
        if r.variant.startswith("search-"):  # a found plan (each deployment's best is the search's): no flag runs it
            assert all("needs code" in f for f in r.flags)
            continue
        _tp, pp, cp, _replicas = r.key[:4]
        if pp > 1 or cp > 1:  # vLLM 0.34.0 refuses DBO beside PP or prefill CP at startup (VllmConfig)
            assert "'does not support: dual batch overlap with p" in r.flags[1]
        else:
            assert "--enable-dbo`" in r.flags[1]  # vLLM's flag
        assert "no engine flag (--enable-dbo is vLLM 0.34.0's)" in r.flags[0]
        m = re.search(rf"without the overlap: ({NUM}) vs ({NUM}) s", r.reason)
        bare = next(v for v in a_dbo.variants if v.shape == r.key[:4] and v.plan.name == r.variant.split("+dbo")[0])
        assert m is not None and _num(m.group(2)) == pytest.approx(
            bare.predictions["prompt16k-c8"].ttft.mean_s, rel=1e-3
        )


def test_the_ranking_sentence_is_the_ranking_table():
    _a, md = _memo("tiny-deepseek-v3", "prompt128k-c1")
    table = _table(_section(md, "Deployments ranked").split("### At `prompt128k-c1`")[1].split("\n- ")[0])
    ranked = [(r[0], r[1].strip("`"), r[3]) for r in table if r[0] != "-"]
    answer = _section(md, "Answer")
    sentence = re.search(r"at `prompt128k-c1`: (.*?)(?:; over the memory cap|\.\n)", answer)
    assert sentence is not None
    said = re.findall(rf"(\d+)\. `([^`]+)` ({NUM}) s", sentence.group(1))
    assert said == ranked
    times = [_num(t) for _, _, t in said]
    assert times == sorted(times)


def _compute_ttft(row) -> float:  # type: ignore[no-untyped-def]
    """A single request's TTFT without the serving loop's fixed costs: its per-request cost and, at PP 1
    (SGLang overlaps its scheduler with the GPU), the overlapped per-step cost of each of its batches."""
    from tpplan.simulate.overheads import REQUEST_ROUND_TRIP, STEP_CPU_OVERLAPPED

    batches = -(-131072 // 8192)  # prompt128k-c1: one request in chunks of 8K
    return row.ttft_s - REQUEST_ROUND_TRIP.value_s - batches * STEP_CPU_OVERLAPPED.value_s


def test_each_reason_adds_up_and_a_single_request_is_its_batches():
    """The reason's parts are the prediction's: their sum is the total it prints, and with one request
    and no PP that total is the request's TTFT (its batches run one after another)."""
    a, md = _memo("tiny-deepseek-v3", "prompt128k-c1")
    rows = {r.label: r for r in a.deployments["prompt128k-c1"]}
    ref = rows["TP2"]
    ref_total = re.search(rf"on one rank, every layer: ({NUM}) ms", ref.reason)
    assert ref_total is not None and _num(ref_total.group(1)) == pytest.approx(1e3 * _compute_ttft(ref), rel=1e-3)
    for label, r in rows.items():
        if label == "TP2":
            continue
        m = re.search(rf": (.*) \(({NUM}) vs ({NUM}) ms\); mean TTFT ({NUM}) vs ({NUM}) s", r.reason)
        assert m is not None, r.reason
        deltas = [_num(x) for x in re.findall(rf"({NUM}) ms", m.group(1))]
        total, ref_ms = _num(m.group(2)), _num(m.group(3))
        assert ref_ms == _num(ref_total.group(1))
        assert sum(deltas) == pytest.approx(total - ref_ms, abs=2e-3 * (total + ref_ms))  # 4 digits each
        assert _num(m.group(4)) == pytest.approx(r.ttft_s, rel=1e-3)
        if r.key[1] == 1:  # one request, no PP: the batches' sum is its TTFT less the engine's fixed costs
            assert total == pytest.approx(1e3 * _compute_ttft(r), rel=1e-3)
        if r.key[2] > 1:
            assert "CP exchanges +" in r.reason  # CP adds its all-gathers
        assert f"`{label}`: {r.reason}" in md


def test_cp_rows_carry_each_engines_flags():
    a, _ = _memo("tiny-deepseek-v3", "prompt128k-c1")
    cp = next(r for r in a.deployments["prompt128k-c1"] if r.key[2] == 2)
    sgl, vll = cp.flags
    assert "`--tp-size 2 --attn-cp-size 2 --enable-prefill-cp --cp-strategy zigzag " in sgl  # --tp-size: TP x CP
    assert "`--tensor-parallel-size 1 --prefill-context-parallel-size 2 " in vll
    # Kimi-K3's SGLang model file has no prefill CP; vLLM's PCP needs MLA in every attention layer
    k3 = deployment_flags("SGLang", "kimi_k3", False, Mesh(8, pp=1, cp=4))
    assert not k3.realised and "kimi_k3.py" in k3.text()
    assert not deployment_flags("vLLM", "kimi_k3", False, Mesh(8, pp=1, cp=4)).realised
    assert deployment_flags("vLLM", "deepseek_v3", True, Mesh(8, pp=1, cp=4)).args == (
        "--tensor-parallel-size 8", "--prefill-context-parallel-size 4")  # fmt: skip
    tbo = deployment_flags("SGLang", "kimi_k3", False, Mesh(8, pp=4, cp=1), "tbo")
    assert not tbo.realised and "NotImplementedError" not in tbo.why  # K3's forward never splits the batch
    # vLLM 0.34.0 refuses --enable-dbo at startup beside PP and for hybrid model classes such as Kimi-K3's
    dbo = deployment_flags("vLLM", "kimi_k3", False, Mesh(8, pp=4, cp=1), "dbo")
    assert not dbo.realised and "with pipeline parallelism" in dbo.why and "with hybrid models (kimi_k3" in dbo.why
    assert deployment_flags("vLLM", "deepseek_v3", True, Mesh(8, pp=1, cp=1), "dbo").args[-1] == "--enable-dbo"
    # async TP: SGLang's layernorm-SP path runs it for Qwen3 only; vLLM 0.33.0 has no such pass
    fused = deployment_flags("SGLang", "qwen3", False, Mesh(8, pp=1, cp=1), "asynctp")
    assert fused.args == ("--tp-size 8", "--enable-layernorm-sp"), fused
    assert not deployment_flags("SGLang", "llama", False, Mesh(8, pp=1, cp=1), "asynctp").realised
    assert not deployment_flags("vLLM", "qwen3", False, Mesh(8, pp=1, cp=1), "asynctp").realised


def test_the_prompt_length_thresholds_follow_the_table():
    """Each end of the CP threshold sentence's intervals lies where the table's best CP and best CP-1
    times change order (one end per change), and the times it quotes are the table's."""
    _a, md = _memo("tiny-deepseek-v3", "prompt16k-c8")
    sec = _section(md, "Prompt length")
    table = _table(sec)
    head = next(line for line in sec.splitlines() if line.startswith("|"))
    cols = {h.strip().strip("`"): i for i, h in enumerate(head.strip("|").split("|"))}
    cp_cols = [i for h, i in cols.items() if "xCP" in h]
    cp1_cols = [i for h, i in cols.items() if h != "prompt tokens" and "xCP" not in h]
    assert cp_cols and cp1_cols
    faster = [min(_num(r[i]) for i in cp_cols) < min(_num(r[i]) for i in cp1_cols) for r in table]
    lengths = [_num(r[0]) for r in table]
    m = re.search(
        r"CP2 against the best CP-1 deployment: ((?:faster|never faster|always faster) .*?)prompt tokens", sec
    )
    assert m is not None, sec
    ends = [_num(x) for x in re.findall(NUM, m.group(1).split("(")[0])]
    flips = [i for i in range(1, len(lengths)) if faster[i - 1] != faster[i]]
    assert len(ends) == len(flips), (m.group(1), faster)
    for x, i in zip(ends, flips, strict=True):
        assert lengths[i - 1] <= x <= lengths[i]
    assert ("up to" in m.group(1)) == (faster[0] and not all(faster))  # "always faster" has no end
    quoted = re.findall(rf"at ({NUM}): ({NUM}) s `([^`]+)` vs ({NUM}) s\s+`([^`]+)`", sec)
    assert quoted
    for length, t_cp, dep_cp, t_1, dep_1 in quoted:
        row = table[lengths.index(_num(length))]
        assert row[cols[dep_cp]] == t_cp and row[cols[dep_1]] == t_1


def test_a_deployment_over_the_cap_says_by_how_much():
    """With a cap between the deployments' memories, the ones above it are listed with the excess the
    table's memory column implies, in the reason and in the answer."""
    a0, _ = _memo("tiny-deepseek-v3", "prompt16k-c8", None)
    mems = sorted(r.memory_bytes for r in a0.deployments["prompt16k-c8"])
    cap_gib = (mems[0] + mems[-1]) / 2 / 2**30
    a, md = _memo("tiny-deepseek-v3", "prompt16k-c8", cap_gib)
    over = [r for r in a.deployments["prompt16k-c8"] if not r.fits]
    assert over and all(r.rank is None for r in over)
    answer = _section(md, "Answer")
    for r in over:
        excess = (r.memory_bytes - a.memory_cap_bytes) / 2**30
        assert f"over the memory cap by {excess:,.1f} GiB" in r.reason
        assert f"`{r.label}` by {excess:,.1f} GiB" in answer
    assert all(r.memory_bytes <= a.memory_cap_bytes for r in a.deployments["prompt16k-c8"] if r.fits)


def test_at_length_keeps_the_protocol():
    w = load_workload("prompt16k-c8")
    w2 = at_length(w, 131072)
    assert (w2.input_len, w2.concurrency, w2.chunk_size, w2.total_requests) == (131072, 8, 8192, 8)


@pytest.mark.slow
def test_kimi_k3_on_4x8_h200_ranks_tp_pp_and_cp_at_16k_and_128k():
    """Issue 23's done-when: for K3 on 4 x 8 H200 at 16K and 128K prompts the memo ranks TP, PP, CP and
    their mixes, each with a reason computed from its priced parts (about 15 s: the search, and every
    deployment priced at both workloads)."""
    wls = [load_workload("prompt16k-c8"), load_workload("prompt128k-c4")]
    a = analyse(
        "kimi-k3",
        load_topology("h200x8-ib400", nodes=4),
        wls,
        MemoAsk(expert_dtype="mxfp4", current="TP32+EP4", prompt_lengths=None),
    )
    for w in wls:
        rows = a.deployments[w.name]
        labels = {r.label for r in rows}
        assert {"TP32", "TP8xPP4", "TP8xCP4", "TP4xCP8"} <= labels  # TP, TP x PP, TP x CP
        ranked = [r for r in rows if r.rank is not None]
        assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
        assert [r.ttft_s for r in ranked] == sorted(r.ttft_s for r in ranked)
        for r in rows:
            assert r.reason and r.flags
            if r.fits and r.label != "TP32":
                assert r.reason.startswith("vs `TP32`") and "compute" in r.reason and "TP collectives" in r.reason
        for r in (r for r in rows if r.key[2] > 1):  # CP: over the cap by its weights (tpplan's CP memory)
            v = a.variant(r.variant)
            assert not r.fits and v is not None
            assert v.predictions[w.name].memory.weights > a.memory_cap_bytes
            assert "the weights alone exceed it" in r.reason
            assert all("no engine flag" in f for f in r.flags)  # kimi_k3: no prefill CP in either engine


def test_a_race_says_where_each_side_stops_fitting():
    from tpplan.report.rows import GroupRace, LengthPoint

    lengths = (1024, 4096, 16384, 65536)

    def pts(times, dep, fit_until):
        return tuple(
            LengthPoint(dep, dep, t, s, 1.0, True) if t <= fit_until else None
            for t, s in zip(lengths, times, strict=True)
        )

    race = GroupRace("CP2", "best CP-1 deployment", lengths, pts((2.0, 1.0, 0.5, 0.1), "TP4xCP2", 16384),
                     pts((1.0, 1.5, 1.0, 1.0), "TP8", 65536))  # fmt: skip
    text = race.sentence(100.0)
    x = float(re.search(rf"faster from ({NUM}) prompt tokens", text).group(1).replace(",", ""))
    assert 1024 < x < 4096  # 2.0 vs 1.0 at 1K, 1.0 vs 1.5 at 4K: the order flips between them
    assert "from 65,536 prompt tokens no CP2 deployment fits under the memory cap of 100.0 GiB" in text
    none = GroupRace("CP4", "best CP-1 deployment", lengths, (None,) * 4, pts((1.0,) * 4, "TP8", 65536),
                     pts((0.5,) * 4, "TP2xCP4", 65536))  # fmt: skip
    assert none.sentence(None).startswith("CP4 fits under GPU memory at no prompt length from 1,024 to 65,536")
    assert "with the memory not capped it would be always faster" in none.sentence(None)


def test_where_a_deployment_stops_fitting_is_the_tables_over_mark():
    """With a cap between a deployment's memory at the shortest and the longest prompt, the memo says
    from which length it stops fitting, and the table marks exactly those lengths `(over)`."""
    a0, _ = _memo("tiny-deepseek-v3", "prompt16k-c8", None)
    pts = next(iter(a0.length_points.values()))
    cap_gib = (pts[0].memory_bytes + pts[-1].memory_bytes) / 2 / 2**30
    _a, md = _memo("tiny-deepseek-v3", "prompt16k-c8", cap_gib)
    sec = _section(md, "Prompt length")
    m = re.search(rf"`([^`]+)` stops fitting from ({NUM}) prompt tokens", sec)
    assert m is not None, sec
    head = next(line for line in sec.splitlines() if line.startswith("|"))
    col = [h.strip().strip("`") for h in head.strip("|").split("|")].index(m.group(1))
    for row in _table(sec):
        assert row[col].endswith("(over)") == (_num(row[0]) >= _num(m.group(2))), row


def test_why_cp_does_not_fit_quotes_the_cp_rows_memory():
    from tpplan.units import gib

    a0, _ = _memo("tiny-deepseek-v3", "prompt16k-c8", None)
    rows = {r.label: r for r in a0.deployments["prompt16k-c8"]}
    a, md = _memo("tiny-deepseek-v3", "prompt16k-c8", 0.99 * rows["TP1xCP2"].memory_bytes / 2**30)
    cp = next(r for r in a.deployments["prompt16k-c8"] if r.label == "TP1xCP2")
    assert not cp.fits
    m = next(iter(a.variant(cp.variant).predictions.values())).memory
    note = next(p for p in md.split("\n\n") if p.startswith("Why the CP deployments do not fit"))
    assert f"`TP1xCP2` holds {gib(m.weights)} of weights per rank, {gib(m.kv_cache)} of KV cache and " in note
    assert ("the weights alone exceed the cap" in note) == (m.weights > a.memory_cap_bytes)
    assert f"against {gib(a.memory_cap_bytes)}" in note
    assert "the whole sequence's KV cache on every CP rank, as the engines keep it" in note  # `--cp-kv engines`
