"""Fuzzing the serving options of the last sessions (--spec and its DRAFT, --router, redundant experts, the
arrival options, --pd, the targets) on audit and search with a topology, so the values reach the serving
loop: held to `fuzzing.check` (exit 0, or one line naming the input; no traceback, nothing left behind).
--engine is the other fuzz test's (its tables load slowly enough to print a progress line)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzzing import FUZZ, SCALE, check
from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.models.config import load_config_dict

SPECS = st.sampled_from(["mtp:3:2.4", "mtp:0:1", "mtp:3:9", "eagle:3:2", "eagle:3:2:org/draft", "eagle:3:2:dir",
                         "eagle:3:2:draft", "eagle:3:2:other", "eagle:3:2:missing.json", "medusa:2:2", "", "::::",
                         "mtp:3:nan", "mtp:16:17", "eagle:1:1:notes.txt"])  # fmt: skip
OPTIONS: dict[str, st.SearchStrategy[str]] = {
    "--spec": SPECS,
    "--router": st.sampled_from(["dp:round_robin", "sglang-router:cache_aware", "vllm:x", "", "x:y:z"]),
    "--replicas": st.sampled_from(["1", "2", "0", "x"]),
    "--ep-num-redundant-experts": st.sampled_from(["0", "2", "8", "9", "-1", "1000", "x"]),
    "--plan": st.sampled_from(["baseline", "dp-attention+a2a", "dp-attention+a2a+redundant2", "sp-moe+redundant99"]),
    "--trace": st.sampled_from(["trace.csv", "dir", "missing.csv", "notes.txt"]),
    "--arrival-rate": st.sampled_from(["2", "0", "-1", "nan", "1e9"]),
    "--requests": st.sampled_from(["4", "0", "100001"]),
    "--workload": st.sampled_from(["chat.toml", "seed-c8", "notes.txt"]),
    "--pd": st.sampled_from(["tp2:tp2", "tp1:tp2:1:2", "tp2:tp2:²:1", "tp0:tp1", "x", "tp2/dp-attention:tp2"]),
}
FILES = ("dir", "notes.txt", "trace.csv", "chat.toml", "draft", "other", "missing.json", "missing.csv")
DRAFT = {**load_config_dict("tiny-llama")[0], "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}


@settings(FUZZ, max_examples=25 * SCALE)
@given(
    command=st.sampled_from(["audit", "audit", "search"]),
    model=st.sampled_from(["tiny-llama", "tiny-deepseek-v3"]),
    given_options=st.lists(st.sampled_from(sorted(OPTIONS)), min_size=1, max_size=4, unique=True),
    data=st.data(),
)
def test_random_serving_options(command, model, given_options, data):  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = _inputs(folder)
        args = [command, "--model", model, "--tp", "2", "--topology", "h200x8-ib400"]
        for opt in given_options:
            value = data.draw(OPTIONS[opt], label=opt)
            args += [opt, _in(folder, value)]
        if command == "search" and "--spec" in given_options and "--workload" not in given_options:
            args += ["--workload", str(folder / "chat.toml")]
        names = [*OPTIONS, "--model", "--topology", "tpplan", *(a for a in args if a)]
        check(args, folder, inputs, (), names)


def _inputs(folder: Path) -> set[str]:
    (folder / "dir").mkdir()
    (folder / "notes.txt").write_text("not a file tpplan reads\n")
    (folder / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,128,9\n0.01,256,5\n")
    (folder / "chat.toml").write_text('name = "chat"\ninput_len = 256\noutput_len = 16\nconcurrency = 4\n'
                                      'chunk_size = 1024\n')  # fmt: skip
    for name, config in (("draft", DRAFT), ("other", {**DRAFT, "vocab_size": 999})):
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(config))
    return {"dir", "notes.txt", "trace.csv", "chat.toml", "draft", "other"}


def _in(folder: Path, value: str) -> str:
    """File values as paths inside the example's folder, also as --spec's DRAFT (presets and words stay)."""
    head, sep, tail = value.rpartition(":")
    if sep and tail in FILES:
        return f"{head}:{folder / tail}"
    return str(folder / value) if value in FILES else value
