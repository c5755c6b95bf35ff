"""Fuzzing the bench results JSON (issue 35): a recorded GPU run (docs/benchmarks/h200x2-2026-11-30,
k3-baseline.json) with values replaced anywhere in it, or its bytes spliced, read back by
`bench --from FILE --md OUT.md` (the markdown and checks, nothing run), held to `fuzzing.check`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzzing import FUZZ, SCALE, VALUES, check
from hypothesis import given, settings
from hypothesis import strategies as st

RUN = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200x2-2026-11-30" / "k3-baseline.json"
BENCH = json.loads(RUN.read_text())


def _paths(data: object, prefix: tuple = ()) -> list[tuple]:
    """Every key or index path into `data` (tables and lists too, so whole sections are replaced)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data[:3]):  # the first rows of each list: enough shapes, fewer paths
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BENCH)


def _run(text: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "run.json").write_bytes(text)
        args = ["bench", "--from", str(folder / "run.json"), "--md", str(folder / "out.md")]
        check(args, folder, {"run.json"}, {"out.md"}, ["run.json", "--from", "--md"])


@settings(FUZZ, max_examples=40 * SCALE)
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), VALUES | st.just("<drop>")), min_size=1, max_size=3))
def test_mutated_bench_results(edits):
    data = json.loads(json.dumps(BENCH))
    for path, value in edits:
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if value == "<drop>" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif value != "<drop>":
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit replaced the section this path went through
    _run(json.dumps(data).encode())


@settings(FUZZ, max_examples=10 * SCALE)
@given(cuts=st.lists(st.tuples(st.integers(0, 20_000), st.binary(max_size=4)), min_size=1, max_size=3))
def test_byte_mutated_bench_results(cuts):
    text = RUN.read_bytes()
    for at, junk in cuts:
        at = at % (len(text) + 1)
        text = text[:at] + junk + text[at + len(junk) :]
    _run(text)
