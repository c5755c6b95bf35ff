"""What every fuzz test holds the CLI to, and the values it throws at it (issues 20 and 35).

`check` runs `tpplan ARGS` in this process (`cli_helpers.run_captured`) and asserts the contract:
exit 0 or 2; no traceback text on either stream (and no uncaught exception: that fails the test
itself); an exit 2 is exactly one line `error: ... Fix: ...` that names the input it is about (one of
the paths or options given); nothing is left in the folder but the inputs, and on exit 0 each output
whole (a JSON file parses, a folder carries its manifest) with tpplan's ledger and lock beside files.

Bounded and derandomized: the examples are the same on every run and the quick lane runs a few
hundred in all. `TPPLAN_FUZZ_SCALE=20 TPPLAN_FUZZ_RANDOM=1` explores 20x more examples from a fresh
seed (by hand); the `slow` tests run more in the slow lane.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from cli_helpers import run_captured
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tpplan.outputs import LEDGER, LOCK, MARKER

SCALE = int(os.environ.get("TPPLAN_FUZZ_SCALE", "1"))
FUZZ = settings(derandomize=not os.environ.get("TPPLAN_FUZZ_RANDOM"), deadline=None, database=None,
                suppress_health_check=list(HealthCheck))  # fmt: skip

# values a careless or hostile file may hold: wrong types, out-of-range numbers, huge and deep ones
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, 10**39]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e30, 1e-300, -0.0, 0.5, 1e308, -1e308, 5e-324]),
    st.text(max_size=6),
    st.sampled_from(["sigmoid", "softmax", "yarn", "silu", "no", "true", "64", "[/]", "[bold]x", "\x1b]0;t\x07"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def check(args: list[str], folder: Path, inputs: Iterable[str], outputs: Iterable[str] = (),
          names: Iterable[str] = ()) -> int:  # fmt: skip
    """Run `args`; hold it to the contract (module docstring). `inputs`: the names in `folder` that
    were there before; `outputs`: the names a successful run writes there; `names`: what an exit-2
    line must mention one of (default: the inputs and outputs)."""
    code, out, err = run_captured(*args)
    assert code in (0, 2), (code, err[-3000:])
    assert "Traceback" not in out and "Traceback" not in err, err[-3000:]
    outs = set(outputs)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0], err[-3000:]
        named = list(names) or [*inputs, *outs]
        assert not named or any(n in lines[0] for n in named), (named, lines[0])
    left = {p.name for p in folder.iterdir()} - set(inputs)
    if code == 0:
        for name in outs:  # written, or replaced where tpplan's own was
            _whole(folder / name)
        allowed = outs | ({LEDGER, LOCK} if any((folder / n).is_file() for n in outs) else set())
    else:
        allowed = {LOCK}  # tpplan's empty lock file may stay where a write was refused under it
    assert left <= allowed, (left, err[-2000:])
    return code


def _whole(path: Path) -> None:
    """An output as a finished write leaves it: JSON that parses, a folder with its manifest."""
    if path.is_dir():
        listed = json.loads((path / MARKER).read_text())["files"]
        assert set(listed) == {p.name for p in path.iterdir()} - {MARKER}
    elif path.suffix == ".json":
        json.loads(path.read_text())
    else:
        assert path.stat().st_size > 0


def preset(*parts: str) -> dict:
    """A packaged cost-model preset (TOML) as a dict."""
    text = resources.files("tpplan.cost").joinpath("presets", *parts).read_text(encoding="utf-8")
    return tomllib.loads(text)


def leaf_paths(data: dict, prefix: tuple = ()) -> list[tuple]:
    """Every key path to a non-table value in `data`."""
    out = []
    for k, v in data.items():
        out += leaf_paths(v, (*prefix, k)) if isinstance(v, dict) else [(*prefix, k)]
    return out


def mutate(base: dict, edits: Iterable[tuple[tuple, object]]) -> dict:
    """A deep copy of `base` with each (key path, value) set, tables rebuilt where an edit replaced one."""
    data = json.loads(json.dumps(base))
    for path, value in edits:
        parent = data
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        parent[path[-1]] = value
    return data
