"""Fuzzing the command options (issue 35): audit, search and explain with a random handful of their
options, each given a value a careless or hostile caller might pass (out of range, empty, the wrong
type, a folder or a missing file where a file goes, an unknown engine version), held to
`fuzzing.check`: exit 0, or one line naming what was wrong, never a traceback."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

from fuzzing import FUZZ, SCALE, check
from hypothesis import given, settings
from hypothesis import strategies as st

INTS = st.sampled_from(["0", "-1", "1", "2", "3", "7", "8", "2" * 20, "1.5", "abc", "", "1e3", " 2"])
FILES = st.sampled_from(["", "missing.toml", ".", "dir", "dir/", "/dev/null", "notes.txt", "x" * 300])
OPTIONS: dict[str, st.SearchStrategy[str]] = {
    "--tp": INTS,
    "--pp": INTS,
    "--cp": INTS,
    "--nodes": INTS,
    "--tokens": st.sampled_from(["1", "64", "0", "-5", str(2**40), "x"]),
    "--dtype": st.sampled_from(["bf16", "fp16", "fp8", "int4", "", "BF16"]),
    "--expert-dtype": st.sampled_from(["fp8", "mxfp4", "bf16", "fp4", ""]),
    "--plan": st.sampled_from(["baseline", "ep2", "sp-moe", "legal", "nope", "", "[/]", "-p"]),
    "--topology": st.sampled_from(["h200x8-ib400", "h200x2", "nope"]) | FILES,
    "--workload": st.sampled_from(["seed-c8", "prompt128k-c1", "nope"]) | FILES,
    "--gpu": st.sampled_from(["h200-datasheet", "l4-datasheet", "nope"]) | FILES,
    "--cluster": st.sampled_from(["h200x8-ib400", "pcie8-rtxpro6000", "nope"]) | FILES,
    "--engine": st.sampled_from(["sglang", "vllm", "sglang@99", "vllm@0.33.0", "trtllm", "x@y", "@", ""]),
    "--memory-cap": st.sampled_from(["none", "gpu", "80", "-1", "0", "abc", "1e400", "nan"]),
    "--objective": st.sampled_from(["time", "volume", "speed", ""]),
    "--top": st.sampled_from(["1", "3", "0", "-1", str(10**9), "x"]),
    "--replicas": st.sampled_from(["1", "2", "all", "0", "-2", "x"]),
    "--overlap": st.sampled_from(["tbo", "dbo", "asynctp", "x", ""]),
    "--cp-layers": st.sampled_from(["all", "mla", "x"]),
    "--json": st.sampled_from(["-", "out.json", "dir", "dir/out.json", "missing/out.json"]),
}
MODELS = st.sampled_from(["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3", "nope", "", "dir"])


@settings(FUZZ, max_examples=40 * SCALE)
@given(
    command=st.sampled_from(["audit", "audit", "search", "explain"]),
    model=MODELS,
    given_options=st.lists(st.sampled_from(sorted(OPTIONS)), min_size=1, max_size=4, unique=True),
    data=st.data(),
)
def test_random_options(command, model, given_options, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "dir").mkdir()
        (folder / "notes.txt").write_text("not a topology\n")
        inputs = {"dir", "notes.txt"}
        args = [command, "--model", _in(folder, model)]
        for opt in given_options:
            args += [opt, _in(folder, data.draw(OPTIONS[opt], label=opt))]
        writes = any(a == "--json" and b == str(folder / "out.json") for a, b in itertools.pairwise(args))
        names = [*OPTIONS, "--model", "tpplan", *(a for a in args if a)]  # a missing option is named too
        check(args, folder, inputs, {"out.json"} if writes else (), names)


def _in(folder: Path, value: str) -> str:
    """Relative file values are made paths inside the example's folder (presets and flags stay)."""
    if value in ("dir", "dir/", ".", "notes.txt", "missing.toml", "out.json", "dir/out.json", "missing/out.json"):
        return str(folder / value)
    return value
