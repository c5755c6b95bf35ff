"""Fuzzing the input edge (issues 20 and 35): mutated configs, plan files, topologies and workloads
against audit, search and explain, in this process, held to `fuzzing.check`'s contract (exit 0 or
one line naming the input with exit 2; no traceback; nothing left but the inputs and whole outputs)."""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path

from fuzzing import FUZZ, SCALARS, SCALE, VALUES, check, leaf_paths, mutate, preset
from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.models.config import load_config_dict

ROPE = st.fixed_dictionaries(
    {"rope_type": st.sampled_from(["default", "linear", "llama3", "yarn", "dynamic", "longrope"]) | SCALARS},
    optional={k: SCALARS for k in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                                   "beta_fast", "mscale", "mscale_all_dim", "rope_theta", "partial_rotary_factor",
                                   "truncate")},
)  # fmt: skip
PRESETS = ("tiny-llama", "tiny-deepseek-v3", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma3", "tiny-kimi-k3")
RUNTIME_KEYS = ("rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
                "tie_word_embeddings", "hidden_act", "scoring_func", "routed_scaling_factor", "norm_topk_prob",
                "quantization_config", "model_type", "text_config", "layer_types", "_name_or_path")  # fmt: skip


@st.composite
def mutated_config(draw: st.DrawFn) -> dict:
    """A tiny preset with one to three fields replaced, removed or added (in text_config for wrappers)."""
    raw = dict(load_config_dict(draw(st.sampled_from(PRESETS)))[0])
    target = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(target) + list(RUNTIME_KEYS)))
        if draw(st.booleans()) and key in target:
            target.pop(key)
        elif key in ("rope_scaling", "rope_parameters") and draw(st.booleans()):
            target[key] = draw(ROPE)
        else:
            target[key] = draw(VALUES)
    return raw


@settings(FUZZ, max_examples=40 * SCALE)
@given(raw=mutated_config(), command=st.sampled_from(["audit", "audit", "audit", "explain", "search"]))
def test_mutated_configs(raw, command):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "config.json"
        path.write_text(json.dumps(raw))
        args = [command, "--model", str(path), "--tp", "2"]
        out = folder / "out.json" if command == "search" else None
        if command == "explain":
            args += ["--plan", "baseline"]
        if out is not None:
            args += ["--topology", "h200x8-ib400", "--json", str(out)]
        check(args, folder, {"config.json"}, {"out.json"} if out is not None else ())


def _plan_file() -> dict:
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.files import Deployment, plan_file_data
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-qwen3-moe"))
    return json.loads(
        plan_file_data(make_plan("sp-moe", graph, 2), graph, {"rank": 1}, Deployment(tp=2)).model_dump_json()
    )


PLAN = _plan_file()
PLAN_PATHS = [(k,) for k in PLAN] + [(s, k) for s in ("decisions", "deployment", "found_for") for k in PLAN[s]]


@settings(FUZZ, max_examples=20 * SCALE)
@given(edits=st.lists(st.tuples(st.sampled_from(PLAN_PATHS), VALUES), min_size=1, max_size=3))
def test_mutated_plan_files(edits):
    data = json.loads(json.dumps(PLAN))
    for path, value in edits:
        parent = data
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}  # an earlier edit replaced the section: rebuild it
            parent = parent[key]
        parent[path[-1]] = value
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "plan.json").write_text(json.dumps(data))
        check(["audit", "--model", "tiny-qwen3-moe", "--tp", "2", "--plan", str(folder / "plan.json")], folder,
              {"plan.json"})  # fmt: skip


TOPOLOGY = preset("h200x8-ib400.toml")
WORKLOAD = preset("workload-prompt16k-c8.toml")


@settings(FUZZ, max_examples=20 * SCALE)
@given(
    which=st.sampled_from(["topology", "workload"]),
    edits=st.lists(st.tuples(st.sampled_from(leaf_paths(TOPOLOGY) + leaf_paths(WORKLOAD)), VALUES), max_size=2),
    command=st.sampled_from(["audit", "search"]),
)
def test_mutated_topologies_and_workloads(which, edits, command):
    base = TOPOLOGY if which == "topology" else WORKLOAD
    mine = [(p, v) for p, v in edits if p in leaf_paths(base)]
    data = mutate(base, mine)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / f"{which}.json"
        path.write_text(json.dumps(data))
        topo, wl = (str(path), "seed-c8") if which == "topology" else ("h200x8-ib400", str(path))
        check([command, "--model", "tiny-llama", "--tp", "2", "--topology", topo, "--workload", wl], folder,
              {path.name})  # fmt: skip


@settings(FUZZ, max_examples=15 * SCALE)
@given(
    which=st.sampled_from(["h200x8-ib400.toml", "workload-prompt16k-c8.toml"]),
    cuts=st.lists(st.tuples(st.integers(0, 2000), st.binary(max_size=4)), min_size=1, max_size=3),
)
def test_byte_mutated_toml(which, cuts):
    """Raw TOML bytes spliced (non-UTF-8, broken syntax, deep brackets): still one line or a run."""
    text = resources.files("tpplan.cost").joinpath("presets", which).read_bytes()
    for at, junk in cuts:
        at = at % (len(text) + 1)
        text = text[:at] + junk + text[at + len(junk) :]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "input.toml"
        path.write_bytes(text)
        topo, wl = (str(path), "seed-c8") if which.startswith("h200") else ("h200x8-ib400", str(path))
        check(["audit", "--model", "tiny-llama", "--tp", "2", "--topology", topo, "--workload", wl], folder,
              {"input.toml"})  # fmt: skip
