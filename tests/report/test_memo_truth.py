"""The memo reads true against its own tables, for every model preset (issue 14).

For each preset (at a TP its heads allow, on an H200 topology) the memo is generated with the real
cost model and read back as markdown: the answer's word is the verdict table's status, a sentence
that calls a plan illegal or engine-less agrees with the verdict and engine tables, the bottom line
follows from the next-steps table and the error band, no model-specific term appears for a model
without the feature behind it, and every number in the answer's prose is a number of a table (the
plan-specific ones: of that plan's row).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from unittest.mock import patch

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "tpplan/models/presets").glob("*.json"))
NUM = re.compile(r"[-+±]?\d[\d,]*(?:\.\d+)?")
STATUS_WORDS = {  # the answer's word for each status (tpplan.report.verdicts.STATUS_WORDS, restated)
    "YES": "Yes",
    "NO": "No",
    "CONDITIONAL": "Yes, with conditions",
    "TOO CLOSE": "Too close to call",
    "OPEN": "Open",
}


def _tp_for(model: str) -> int:
    """The largest TP of 8, 4, 2 at which the model's baseline plan can be built."""
    graph = build_model_graph(load_model(model))
    for tp in (8, 4, 2):
        try:
            make_plan("baseline", graph, tp)
            heads = [getattr(lg.spec.attn, "heads", tp) for lg in graph.kinds.values()]
            if all(h % tp == 0 for h in heads):
                return tp
        except TpplanError:
            continue
    return 1


@cache
def memo_for(model: str, current: str = "baseline", expert_dtype: str | None = "mxfp4") -> tuple[object, str]:
    big = model in ("kimi-k3",)
    topo = load_topology("h200x8-ib400", nodes=4 if big else 1)
    tp = 32 if big else _tp_for(model)
    wls = [load_workload("seed-c8")]
    a = analyse(
        model, topo, wls, MemoAsk(deployment=MeshAsk(tp=tp), expert_dtype=expert_dtype, current=current, search_top=0)
    )
    # The checks read the text; drawing the PNGs (most of the time) is tested in test_report.py.
    from tpplan.report import plots

    names = ("volume_vs_tp", "stacked_time", "grouped_bars", "crossover", "predicted_vs_measured")
    with patch.multiple(plots, **{n: (lambda *args, **kw: b"") for n in names}):
        return a, build_memo(a).markdown


# -- reading the markdown back ------------------------------------------------------------------


def section(md: str, title_start: str) -> str:
    start = md.find(f"\n## {title_start}")
    if start < 0:
        return ""
    nxt = md.find("\n## ", start + 4)
    return md[start : nxt if nxt > 0 else len(md)]


def tables(md: str) -> list[tuple[list[str], list[list[str]]]]:
    out = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = [c.strip() for c in lines[i].strip("|").split(" | ")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append([c.strip() for c in lines[i][2:-2].split(" | ")])
                i += 1
            out.append((head, rows))
        else:
            i += 1
    return out


def table_by(md: str, first: str, col: str) -> dict[str, dict[str, str]]:
    """Rows of the table whose header has column `col`, keyed by column `first` (backticks stripped)."""
    for head, rows in tables(md):
        if col in head and first in head:
            return {r[head.index(first)].strip("`"): dict(zip(head, r, strict=False)) for r in rows}
    return {}


def numbers(text: str) -> list[float]:
    text = re.sub(r"`[^`]*`", " ", text)  # plan names, formulas, file names
    # names that hold digits (TP8, deepseek-v3, h200x8-ib400, x4) and bracketed shapes are not numbers
    text = re.sub(r"\b(?=[\w.-]*[a-zA-Z])(?=[\w.-]*\d)[\w.-]+\b|\[[^\]]*\]", " ", text)
    return [abs(float(m.replace(",", "").lstrip("+-±"))) for m in NUM.findall(text)]


def table_numbers(md: str) -> set[float]:
    out: set[float] = set()
    for _, rows in tables(md):
        for r in rows:
            for cell in r:
                out.update(numbers(cell))
                out.update(abs(float(x.replace(",", "").lstrip("+-±"))) for x in NUM.findall(cell))
    return out


def paragraphs(sec: str) -> list[str]:
    return [p for p in sec.split("\n\n") if p and not p.startswith(("|", "#", "!", "```", "- "))]


# -- the checks ---------------------------------------------------------------------------------


def check_answer_word(md: str) -> None:
    verdicts = table_by(md, "plan", "verdict")
    m = re.search(r"input-scattered \(TP reduce-scatter\) prefill pay off[^*]*\?\*\* \*\*([^*]+)\*\*", md)
    if m is None:
        return
    status = verdicts["input-scattered"]["verdict"]
    assert m[1] == STATUS_WORDS.get(status, status), f"answer says {m[1]!r}, the table says {status}"


def check_legality_sentences(md: str) -> None:
    verdicts = table_by(md, "plan", "verdict")
    prose = " ".join(paragraphs(section(md, "Answer")) + paragraphs(section(md, "Where tpplan")))
    for m in re.finditer(r"`?([a-z0-9+-]+)`? is illegal", prose):
        if m[1] in verdicts:
            assert verdicts[m[1]]["legal"] == "NO", f"prose: {m[0]!r}; table: legal {verdicts[m[1]]['legal']}"
    for m in re.finditer(r"`([a-z0-9+-]+)` [\d.]+ \([^)]*, (legal|illegal) here\)", prose):
        assert (verdicts[m[1]]["legal"] == "yes") == (m[2] == "legal"), m[0]


def check_engine_sentences(md: str) -> None:
    engines: dict[str, dict[str, str]] = {}
    for head, rows in tables(md):
        if head[:3] == ["plan", "engine", "realised"]:
            for r in rows:
                engines.setdefault(r[0].strip("`"), {})[r[1]] = r[2]
    for t, body in re.findall(r"\n### ([^\n]+)\n\n([^\n]+)", section(md, "Where tpplan")):
        if "No engine flag realises it" in body and "gate-aware" in t:
            assert set(engines["gate-aware"].values()) == {"no"}, engines["gate-aware"]
    bottom = next((p for p in paragraphs(section(md, "Answer")) if p.startswith("**Switch")), "")
    m = re.match(r"\*\*Switch(?:, if its conditions hold,)? from `[^`]+` to `([^`]+)`", bottom)
    if m:  # a switch names the engine whose flags run it, and that engine's table row says it realises it
        launch = re.search(r" Launch: (SGLang|vLLM) ([\w.]+): `", bottom)
        assert launch, bottom
        realised = [r for e, r in engines[m[1]].items() if e.lower() == f"{launch[1]}@{launch[2]}".lower()]
        assert realised == ["yes"], (launch.groups(), engines[m[1]])


def check_bottom_line(md: str, band: float) -> None:
    answer = paragraphs(section(md, "Answer"))
    bottom = [p for p in answer if p.startswith(("**Switch", "**Keep"))]
    assert len(bottom) == 1, "exactly one bottom line"
    text = bottom[0]
    steps = list(table_by(md, "plan", "beyond band").values())
    rows = table_by(md, "plan", "mean s").items()
    ttft = {k: float(r["mean s"]) for k, r in rows if r.get("workload") == "prompt16k-c8"}
    cur = re.search(r"today's deployment \(`--current`\): `([^`]+)`", md)
    assert cur is not None
    if text.startswith("**Switch"):
        m = re.match(r"\*\*Switch(?:, if its conditions hold,)? from `([^`]+)` to `([^`]+)`\*\*: predicted mean TTFT "
                     r"at \S+ ([\d.]+) s vs ([\d.]+) s \(-([\d.]+)%\)", text)  # fmt: skip
        assert m, text
        # the target is the best step an engine runs (its engine column is a launch line, not "needs code")
        runnable = [s for s in steps if not s["engine"].startswith("needs code")]
        assert m[1] == cur[1] and runnable and runnable[0]["plan"].strip("`") == m[2], (m.groups(), runnable[:1])
        assert runnable[0]["beyond band"] == "yes"
        assert float(m[3]) == ttft[m[2]] and float(m[4]) == ttft[m[1]]
        assert float(m[5]) / 100 > band
        verdict = table_by(md, "plan", "verdict").get(m[2], {}).get("verdict")
        if verdict == "CONDITIONAL":  # a conditional plan is never recommended without its conditions
            assert "if its conditions hold" in text and "Conditions: (1)" in text, text
    else:
        assert f"**Keep `{cur[1]}`" in text
        runnable = [s for s in steps if not s["engine"].startswith("needs code")]
        assert not runnable or runnable[0]["beyond band"] != "yes", "a runnable step beyond the band, but it keeps"
    faster = re.search(r"The fastest predicted, `([^`]+)` \(predicted mean TTFT at \S+ ([\d.]+) s", text)
    if steps and steps[0]["engine"].startswith("needs code"):  # the faster step that needs code, named after
        assert faster and faster[1] == steps[0]["plan"].strip("`") and float(faster[2]) == ttft[faster[1]], text
    else:
        assert faster is None, text


def check_numbers(md: str) -> None:
    """Every number in the answer is a table's; the per-plan ones are that plan's."""
    pool = table_numbers(md)
    answer = [p for p in paragraphs(section(md, "Answer")) if "in the audit's words" not in p]
    for p in answer:
        for x in numbers(p):
            assert any(abs(x - y) <= 1e-9 + 1e-6 * y for y in pool), f"{x:g} in {p[:160]!r} is in no table"
    mla = table_by(md, "tpplan plan", "tpplan units")
    for p in answer:
        for m in re.finditer(r"`([a-z0-9+-]+)` ([\d.]+) \(([-+][\d.]+)%, (?:il)?legal here\)", p):
            row = mla[m[1]]
            assert float(row["tpplan units"]) == float(m[2]), f"{m[0]!r} vs table {row['tpplan units']}"
            assert row["vs all-reduce"] == f"{m[3]}%", f"{m[0]!r} vs table {row['vs all-reduce']}"
    verdicts = table_by(md, "plan", "verdict")
    for p in answer:
        for m in re.finditer(r"`([a-z0-9+-]+)` moves ([-+][\d.]+%) bytes per token per rank \(([\d,]+) vs", p):
            assert verdicts[m[1]]["bytes/token/rank"] == m[3], m[0]
            assert m[2] in verdicts[m[1]]["why"], m[0]


def features(a: object) -> dict[str, bool]:
    g = a.graph  # type: ignore[attr-defined]
    attn = [lg.spec.attn for lg in g.kinds.values()]
    mlps = [lg.spec.mlp for lg in g.kinds.values()]
    return {
        "attn_res": bool(g.spec.attn_res_block_size),
        "kda": any(x.kind == "kda" for x in attn),
        "latent_moe": any(getattr(m, "latent", None) for m in mlps),
        "ep": any(v.plan.moe == "ep" for v in a.variants),  # type: ignore[attr-defined]
        "seed": g.spec.model_type == "kimi_k3",
        "output_gate": any(getattr(x, "output_gate", False) for x in attn),
        "mla": any(x.kind == "mla" for x in attn),
        "pp": any(v.pp > 1 for v in a.variants),  # type: ignore[attr-defined]
    }


TERMS = {  # K3-only (or feature-only) wording -> the feature that must be behind it
    r"attention[- ]residual": "attn_res",
    r"\bKDA\b": "kda",
    r"latent MoE|latent projections": "latent_moe",
    r"\bEP\d+\b|`ep\d+": "ep",
    r"\bseed\b|seed's": "seed",
    r"output gate": "output_gate",
    r"\bMLA\b": "mla",
    r"\bPP\d+\b|[Pp]ipeline parallel": "pp",
}


def check_terms(a: object, md: str) -> None:
    have = features(a)
    text = md
    for w in a.workloads:  # type: ignore[attr-defined]
        text = text.replace(w.name, "<workload>")
    for pattern, feature in TERMS.items():
        if not have[feature]:
            hit = re.search(pattern, text)
            where = text[hit.start() - 80 : hit.end() + 40] if hit else ""
            assert hit is None, f"{hit[0]!r} in a memo for a model without {feature}: ...{where!r}"


# The engine-path sentences the memo prints (tpplan/engines/recipes/base.py path_sentence), and the
# engine data's mode each flag names.
PATH_SENTENCE = re.compile(r"(SGLang|vLLM) (\S+) (wires|does not wire) (.+?) for (\w+)")
FLAG_MODE = {
    "--enable-attn-tp-input-scattered": "input-scattered",
    "--enable-layernorm-sp": "layernorm-sp",
    "SP-MoE": "sp-moe",
    "MoE sequence parallelism": "moe-sp",
    "the sequence-parallelism pass": "sp-pass",
}
RUNS_PLAN = re.compile(r"--enable-attn-tp-input-scattered runs `([\w+-]+)` on (\w+)")
SP_MOE_DEFAULT = re.compile(r"wires SP-MoE for (\w+) .*?: by default it runs `([\w+-]+)`")


def check_engine_paths(a: object, md: str) -> None:
    """No memo sentence says an engine runs a path its data says it does not: every "wires" / "does
    not wire" sentence and every "the flag runs `plan`" agrees with tpplan.engines for the model."""
    from tpplan.engines import path_for, select

    spec = a.graph.spec  # type: ignore[attr-defined]
    seen = 0
    for engine, version, verb, flag, model_type in PATH_SENTENCE.findall(md):
        assert model_type == spec.model_type, f"{engine} sentence about {model_type} in a {spec.model_type} memo"
        mode = select(f"{engine}@{version}").mode(FLAG_MODE[flag])
        assert mode is not None, (engine, version, flag)
        wired = path_for(mode, spec).wired
        assert wired == (verb == "wires"), f"memo: {engine} {version} {verb} {flag} for {model_type}; data: {wired}"
        seen += 1
    for plan, model_type in RUNS_PLAN.findall(md):
        mode = select(a.engines[0]).mode("input-scattered")  # type: ignore[attr-defined]
        assert path_for(mode, spec).runs_plan == plan, f"memo: the flag runs {plan} on {model_type}"
    for model_type, plan in SP_MOE_DEFAULT.findall(md):
        mode = select(a.engines[0]).mode("sp-moe")  # type: ignore[attr-defined]
        assert path_for(mode, spec).runs_plan == plan, f"memo: deepep runs {plan} by default on {model_type}"
    for v in a.variants:  # type: ignore[attr-defined]
        for e in v.engines:  # the norm-on-shard K3 variant only where its fused collectives run
            if "SGLANG_K3_SP_ATTN_RES=1" in e.env:
                fused = [c for c in e.conditions if "fused SP" in c.text]
                assert fused and all(c.met is True for c in fused), (v.key, fused)
    assert "really runs input-scattered+restore" not in md  # the claim issue 24 found false
    if a.variant("sglang-input-scattered") is not None:  # type: ignore[attr-defined]
        assert seen, "the memo never says what SGLang does with --enable-attn-tp-input-scattered here"


def check_all(a: object, md: str) -> None:
    check_answer_word(md)
    check_legality_sentences(md)
    check_engine_sentences(md)
    check_engine_paths(a, md)
    check_bottom_line(md, a.provenance.band)  # type: ignore[attr-defined]
    check_numbers(md)
    check_terms(a, md)


@pytest.mark.parametrize("model", PRESETS)
def test_memo_reads_true_for_every_preset(model):
    a, md = memo_for(model)
    check_all(a, md)


def test_deepseek_v3_bf16_does_not_fit_and_is_never_yes():
    """Issue 10: a plan that does not fit in GPU memory is never rated YES (bf16 experts on 8 x H200)."""
    a, md = memo_for("deepseek-v3", expert_dtype=None)
    check_all(a, md)
    for v, vd in zip(a.variants, a.verdicts, strict=True):
        fit = next(iter(v.predictions.values())).memory.total <= 140 * 2**30
        assert fit or vd.status in ("NO", "reference"), (v.key, vd.status)


def test_k3_with_todays_deployment():
    """K3 on 4 x 8 H200 judged against TP32 with EP4: EP4 is today's, not a next step."""
    a, md = memo_for("kimi-k3", current="TP32 EP4")
    check_all(a, md)
    assert a.current.key == "ep4" and "ep4" not in [s.key for s in a.next_steps]
    assert a.bottom.action == "switch"


def test_k3_memo_starts_from_what_the_engine_does_with_the_flag():
    """Issue 24: the K3 memo's answer opens with SGLang not wiring the flag for K3 (with its source),
    before legality and volumes."""
    _, md = memo_for("kimi-k3")
    answer = md.split("## Answer", 1)[1].split("\n## ", 1)[0]
    first = answer.strip().split("\n\n")[0]
    assert "does not wire --enable-attn-tp-input-scattered for kimi_k3" in first and "kimi_k3.py" in first


def test_k3_memo_says_what_deepep_runs_on_h200():
    """Issue 24: with --moe-a2a-backend deepep on H200 at TP32, SGLang runs K3's default SP-MoE path
    (the bank on every row: `sglang-sp-moe`) on NCCL, not the fused SP collectives; the memo prices
    that plan, says so with its source, and never prints the SGLANG_K3_SP_ATTN_RES=1 variant's line."""
    a, md = memo_for("kimi-k3")
    engines = section(md, "Engine flags")
    said = re.findall(r"wires SP-MoE for kimi_k3 .*?: by default it runs `sglang-sp-moe`.*?run on NCCL.*", engines)
    assert said and all("k3_sp_collective.py" in x and re.search(r"H200 \(sm90\), TP\d+ fails", x) for x in said)
    assert any("TP32 fails" in x for x in said)  # today's shape; the TP8 x PP4 choice fails on sm90 too
    assert "SGLANG_K3_SP_ATTN_RES=1 python" not in md
    sgl = next(e for e in a.variant("sglang-sp-moe").engines if e.engine == "SGLang")
    assert sgl.realises == "yes" and "--moe-a2a-backend deepep" in sgl.args
    assert "| `sglang-sp-moe` |" in section(md, "Answer") + section(md, "Verdicts") + md


def test_identical_decisions_get_identical_engine_verdicts():
    """On DeepSeek-V3 gate-aware repairs nothing: same decisions as input-scattered, same verdicts."""
    a, _ = memo_for("deepseek-v3")
    assert a.same_as.get("gate-aware") == "input-scattered"
    by = {v.key: v for v in a.variants}
    for x, y in zip(by["gate-aware"].engines, by["input-scattered"].engines, strict=True):
        assert (x.realises, x.args, x.summary) == (y.realises, y.args, y.summary)
    vd = {v.key: v.status for v in a.verdicts}
    assert vd["gate-aware"] == vd["input-scattered"]


def test_the_checks_can_fail():
    """Each check rejects a memo with the contradiction it guards against (edited from a real one)."""
    a, md = memo_for("deepseek-v3")
    bad = {
        "answer word": md.replace("**Too close to call**", "**Yes**").replace("**No** (NO)", "**Yes** (NO)"),
        "legality": md.replace("MoE all-to-all", "MoE all-to-all").replace(
            "(moe_a2a_backend must be none)",
            "(moe_a2a_backend must be none), which costs nothing here: input-scattered is illegal on this model",
        ),
        "units": re.sub(r"`latent-scattered` 16448 \(\+14\.7%", "`latent-scattered` 9280 (-35.3%", md),
        "term": md + "\nK3's attention-residual bank.\n",
        "engine path": md.replace(
            "SGLang 0.5.23 wires --enable-attn-tp-input-scattered for deepseek_v3",
            "SGLang 0.5.23 does not wire --enable-attn-tp-input-scattered for deepseek_v3",
        ),
        "deepep path": md.replace("by default it runs `sp-moe`", "by default it runs `sglang-sp-moe`"),
    }
    checks = {
        "answer word": check_answer_word,
        "legality": check_legality_sentences,
        "units": check_numbers,
        "term": lambda m: check_terms(a, m),
        "engine path": lambda m: check_engine_paths(a, m),
        "deepep path": lambda m: check_engine_paths(a, m),
    }
    for name, text in bad.items():
        assert text != md, name
        with pytest.raises(AssertionError):
            checks[name](text)


def test_audit_crossover_json(monkeypatch, capsys):
    """`tpplan audit --crossover --json`: one row per plan and layer kind, with the grid's points."""
    import sys

    from tpplan import cli

    argv = ["tpplan", "audit", "-m", "tiny-kimi-k3", "--tp", "2", "-t", "h200x2", "--crossover", "--json"]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    rows = json.loads(capsys.readouterr().out)["crossover"]
    assert rows and {"plan", "kind", "overtakes_at_tokens", "stops_at_tokens", "points"} <= set(rows[0])
    assert all(r["plan"] != "baseline" for r in rows)
    assert {r["kind"] for r in rows} >= {"whole model"}
