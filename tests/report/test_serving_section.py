"""The memo's Serving section (`tpplan report --ttft-target/--tpot-target`): its sentences are made from the
figures printed beside them, its launch lines pin the memory settings the simulation assumed."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from tpplan.engines.serving_flags import memory_flags, pd_flags
from tpplan.report.rows import fig
from tpplan.report.serving_memo import with_flags
from tpplan.report.serving_section import chosen_text
from tpplan.search.serving_points import DeploymentAnswer, Load, ServingPoint
from tpplan.search.targets import Target, Targets, seconds_text

TARGETS = Targets(Target("ttft", 2.0, "p90"), Target("tpot", 0.05, "p99"))


def _point(ttft: float, tpot: float, goodput: float = 0.125) -> ServingPoint:
    achieved = {"ttft": ttft, "tpot": tpot}
    return ServingPoint("2x TP8", "baseline", "aggregated", 8, Load(clients=16), 32, achieved, 30, goodput, 61.5,
                        30.2, {}, {}, TARGETS.met(achieved), TARGETS.worst_ratio(achieved))  # type: ignore[arg-type]  # fmt: skip


def _answer(p: ServingPoint, binds: str = "decode", why: str = "why") -> DeploymentAnswer:
    return DeploymentAnswer(None, 2, (p,), p if p.met else None, 138, 10_000, 2048, binds, why)  # type: ignore[arg-type]


@pytest.mark.parametrize(("ttft", "tpot"), [(1.5, 0.0334), (1.9, 0.049), (2.5, 0.07)])
def test_the_chosen_sentence_says_the_figures_it_was_made_from(ttft: float, tpot: float) -> None:
    p = _point(ttft, tpot)
    text = chosen_text(TARGETS, _answer(p))
    assert f"p90 TTFT {seconds_text(ttft)} (target 2 s)" in text
    assert f"p99 TPOT {seconds_text(tpot)} (target 50 ms)" in text
    assert f"{p.goodput_per_gpu:.3g} good requests/s per GPU" in text and "16 clients per replica" in text
    assert ("meets the targets" in text) == p.met and ("misses them" in text) == (not p.met)
    other = chosen_text(TARGETS, _answer(replace(p, achieved={"ttft": ttft * 1.1, "tpot": tpot})))
    assert seconds_text(ttft * 1.1) in other and other != text  # a changed figure changes its sentence


def test_small_token_rates_keep_their_figures() -> None:
    """Kimi-K3 on 32 GPUs at one client serves 0.49 output tokens/s per GPU: it printed as '0', and 4.7 beside
    4.4 as '5' and '4'. Below 100, rates keep three significant digits; above, whole numbers as before."""
    p = replace(_point(1.5, 0.0334), output_tok_s_per_gpu=0.49, output_tok_s_per_user=16.43)
    text = chosen_text(TARGETS, _answer(p))
    assert "0.49 output tokens/s per GPU, 16.4 tokens/s per user" in text
    big = replace(p, output_tok_s_per_gpu=1267.3, output_tok_s_per_user=172.4)
    assert "1,267 output tokens/s per GPU, 172 tokens/s per user" in chosen_text(TARGETS, _answer(big))


def test_launch_flags_take_the_engines_derived_memory_settings() -> None:
    sgl = memory_flags("sglang@0.5.23", {"mem_fraction_static": 0.853}, 8192, 64)
    assert sgl == ("--mem-fraction-static 0.853", "--chunked-prefill-size 8192", "--max-running-requests 64")
    vll = memory_flags("vllm@0.34.0", {"gpu_memory_utilization": 0.92}, 4096, None)
    assert vll == ("--gpu-memory-utilization 0.92", "--max-num-batched-tokens 4096")
    assert pd_flags("sglang@0.5.23", "decode") == ("--disaggregation-mode decode",)
    # vLLM's NixlConnector deprecates kv_both (NixlBaseConnector.__init__, 0.33.0 and 0.34.0): one role per side
    assert [pd_flags("vllm@0.34.0", r)[0].split('"kv_role":')[1] for r in ("prefill", "decode")] == [
        '"kv_producer"}\'',
        '"kv_consumer"}\'',
    ]
    args = ("--tp-size 8", "--chunked-prefill-size 8192", "--nnodes 1")
    assert with_flags(args, ("--chunked-prefill-size 2048",)) == (
        "--tp-size 8",
        "--nnodes 1",
        "--chunked-prefill-size 2048",
    )


@pytest.mark.slow
def test_the_memo_names_the_chosen_deployment_its_figures_and_launch_lines(tmp_path: Path) -> None:
    """A memo under targets: each chosen deployment's bullet quotes the figures of its table row."""
    from tests.cli_helpers import run_captured

    wl = tmp_path / "chat.toml"
    wl.write_text('name = "chat"\ninput_len = 512\noutput_len = 32\nconcurrency = 4\nchunk_size = 1024\n')
    out = tmp_path / "memo"
    code, _, err = run_captured("report", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "-w", str(wl),
                                "--ttft-target", "1s", "--tpot-target", "p99:0.7ms", "--out", str(out))  # fmt: skip
    assert code == 0, err
    text = (out / "report.md").read_text()
    section = text[text.index("## Serving") :]
    section = section[: section.index("\n## ", 3)]
    rows = {r.split("|")[1].strip().removesuffix(" (needs code)"): r.split("|")
            for r in section.splitlines() if r.startswith("| `")}  # fmt: skip
    bullets = [b for b in section.splitlines() if b.startswith("- `")]
    assert bullets and "p90 TTFT <= 1 s and p99 TPOT <= 700 us" in section
    for b in bullets:
        name = b[2 : b.index("`", 3) + 1]
        ttft = re.search(r"p90 TTFT ([0-9.,]+ (?:s|ms|us)) \(target", b)
        assert ttft is not None and name in rows
        value = float(ttft.group(1).split()[0]) * {"s": 1e3, "ms": 1.0, "us": 1e-3}[ttft.group(1).split()[1]]
        assert fig(value) == rows[name][3].strip()  # the bullet's TTFT is its table row's, in ms
        assert "What binds:" in b
    assert "Launch lines for" in section and "Flags read from:" in section
