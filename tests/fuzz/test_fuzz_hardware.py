"""Fuzzing the hardware files (issue 35): GPU model files (`--gpu FILE`), cluster files with their
collective curves written out (`--cluster FILE`; curve points near 1e308 once overflowed the latency
fit), field by field and byte by byte, priced by `audit` with a workload, held to `fuzzing.check`."""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path

from fuzzing import FUZZ, SCALARS, SCALE, VALUES, check, leaf_paths, mutate, preset
from hypothesis import given, settings
from hypothesis import strategies as st

GPU = preset("gpus", "h200-datasheet.toml")


def _cluster() -> dict:
    from tpplan.cost.topology import _cluster_data

    return _cluster_data("h200x8-ib400")[0]  # its curve sets written out as curves


CLUSTER = _cluster()
AUDIT = ["audit", "--model", "tiny-llama", "--tp", "2", "--workload", "seed-c8"]


def _run(data: dict | bytes, option: str, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / f"input{suffix}"
        path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
        args = [*AUDIT, option, str(path)]
        if option == "--gpu":
            args += ["--topology", "h200x8-ib400"]
        check(args, folder, {path.name})


@settings(FUZZ, max_examples=25 * SCALE)
@given(edits=st.lists(st.tuples(st.sampled_from(leaf_paths(GPU)), VALUES), min_size=1, max_size=3))
def test_mutated_gpu_files(edits):
    _run(mutate(GPU, edits), "--gpu", ".json")


# a curve point, a whole curve's field, or a cluster field
CURVE_EDIT = st.one_of(
    st.tuples(st.just("point"), st.integers(0, 200), st.integers(0, 40), st.sampled_from([0, 1]), SCALARS),
    st.tuples(st.just("curve"), st.integers(0, 200), st.sampled_from(["kind", "algorithm", "ranks", "points"]), VALUES),
    st.tuples(st.just("field"), st.sampled_from(leaf_paths(CLUSTER)), VALUES),
)


def _edit_cluster(edits: list) -> dict:
    data = json.loads(json.dumps(CLUSTER))
    curves = data["curves"]
    for edit in edits:
        if edit[0] == "field":
            data = mutate(data, [edit[1:]])
            continue
        curve = curves[edit[1] % len(curves)]
        if edit[0] == "curve":
            curve[edit[2]] = edit[3]
        elif isinstance(curve.get("points"), list) and curve["points"]:
            point = curve["points"][edit[2] % len(curve["points"])]
            if isinstance(point, list) and len(point) == 2:
                point[edit[3]] = edit[4]
    return data


@settings(FUZZ, max_examples=30 * SCALE)
@given(edits=st.lists(CURVE_EDIT, min_size=1, max_size=3))
def test_mutated_cluster_files_and_curves(edits):
    _run(_edit_cluster(edits), "--cluster", ".json")


@settings(FUZZ, max_examples=10 * SCALE)
@given(cuts=st.lists(st.tuples(st.integers(0, 1500), st.binary(max_size=4)), min_size=1, max_size=3))
def test_byte_mutated_gpu_toml(cuts):
    text = resources.files("tpplan.cost").joinpath("presets", "gpus", "h200-datasheet.toml").read_bytes()
    for at, junk in cuts:
        at = at % (len(text) + 1)
        text = text[:at] + junk + text[at + len(junk) :]
    _run(text, "--gpu", ".toml")
