"""The golden outputs of fixed commands (tools/golden.py, tests/golden/) are what tpplan prints today.

The quick lane checks a few commands (`QUICK`, about a second); the slow lane checks all of them. The
example memos are checked by tests/report/test_report.py::test_checked_in_example_is_current, not here.
After a change that moves an output on purpose: `python -m tools.golden --write NAME` and say in the
commit why each difference is right (tests/golden/README.md).
"""

from __future__ import annotations

import json
import shutil

import pytest

from tools import golden


def _check(names: list[str]) -> None:
    found = golden.check(names, echo=False)
    changed = {n: d[:5] for n, d in found.items() if d}
    assert not changed, f"outputs differ from tests/golden/ (python -m tools.golden --check): {changed}"


def test_quick_golden_outputs_are_current(handlers):
    _check(list(golden.QUICK))


@pytest.mark.slow
def test_every_golden_output_is_current(handlers):
    _check(list(golden.COMMANDS))


def test_every_command_has_its_file_and_every_file_its_command():
    stored = {p.stem for p in golden.GOLDEN.glob("*.json")}
    assert stored == set(golden.COMMANDS)
    assert set(golden.QUICK) <= set(golden.COMMANDS) and len(golden.COMMANDS) >= 20
    assert len(golden.memo_commands()) == 5  # docs/examples/README.md's five documented memos


def test_a_changed_number_is_found_and_named(tmp_path, handlers):
    """The check can fail: a golden file with one number moved differs from today's output, and the
    summary names the key and both values."""
    name = golden.QUICK[0]
    shutil.copy(golden.GOLDEN / f"{name}.json", tmp_path / f"{name}.json")
    assert golden.compare(name, tmp_path, golden=tmp_path) == []
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    plan = doc["output"]["plans"][0]
    before = plan["comm_bytes_per_token_per_rank"]
    plan["comm_bytes_per_token_per_rank"] = before + 1
    (tmp_path / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    found = golden.compare(name, tmp_path, golden=tmp_path)
    assert found == [f".output.plans[{plan['name']}].comm_bytes_per_token_per_rank: {before + 1} -> {before}"]


def test_only_wall_clock_times_and_checkout_paths_are_normalised():
    out = {"search": {"seconds": 3.1, "families": 28}, "seconds": 2.0, "file": f"{golden.ROOT}/x.json"}
    assert golden.normalise(out) == {
        "search": {"seconds": "<wall-clock>", "families": 28},
        "seconds": 2.0,
        "file": "<repo>/x.json",
    }


def test_differences_index_named_lists_by_name():
    old = {"plans": [{"name": "a", "t": 1.0}, {"name": "b", "t": 2.0}]}
    assert golden.differences(old, {"plans": [{"name": "b", "t": 2.0}, {"name": "a", "t": 1.0}]}) == [
        ".plans: names ['a', 'b'] -> ['b', 'a']"
    ]
    assert golden.differences(old, {"plans": [{"name": "a", "t": 1.5}, {"name": "b", "t": 2.0}]}) == [
        ".plans[a].t: 1.0 -> 1.5"
    ]
