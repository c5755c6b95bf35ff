"""Issue 20's input cases, one test each: every bad file or value is one line on stderr and exit 2,
at once (no hang, no traceback), and the runtime uses the numerics of the file it was given."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_captured as run

from tpplan.errors import TpplanError
from tpplan.inputs import MAX_INPUT_BYTES, MAX_NESTING, load_json, parse_json, parse_toml
from tpplan.models.config import load_config_dict, load_model

TINY = load_config_dict("tiny-llama")[0]


def refused(*args: str, match: str = "") -> str:
    """Run, expect exit 2 with exactly one line on stderr containing `match`; return that line."""
    t0 = time.monotonic()
    code, _, err = run(*args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and match in lines[0], lines[0]
    assert time.monotonic() - t0 < 10
    return lines[0]


def config(tmp_path: Path, name: str = "config.json", **fields: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({**TINY, **fields}))
    return str(path)


def audit(model: str, match: str = "") -> str:
    return refused("audit", "--model", model, "--tp", "2", match=match)


# ----------------------------------------------------------------------------------------------
# Item 4: files that are not regular files, or too large, are refused from os.stat (no read, no hang)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    audit(str(fifo), "not a regular file (a FIFO)")
    link = tmp_path / "topo.toml"
    link.symlink_to(fifo)
    refused("search", "--model", "tiny-llama", "--topology", str(link), "--tp", "2", match="FIFO")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_symlink_to_a_device_is_refused(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    link = tmp_path / "config.json"
    link.symlink_to(device)
    audit(str(link), "a device")
    wl = tmp_path / "w.toml"
    wl.symlink_to(device)
    refused("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400", "--workload", str(wl),
            match="a device")  # fmt: skip


def test_a_file_over_the_size_cap_is_refused_before_reading(tmp_path):
    big = tmp_path / "config.json"
    with big.open("wb") as f:  # sparse: nothing is written, st_size says 64 MiB + 1
        f.truncate(MAX_INPUT_BYTES + 1)
    audit(str(big), "more than the 64 MiB")


def test_a_folder_without_config_json_says_so(tmp_path):
    (tmp_path / "weights").mkdir()
    line = audit(str(tmp_path / "weights"), "no config.json in folder")
    assert str(tmp_path / "weights") in line


# ----------------------------------------------------------------------------------------------
# Item 5: malformed files are one line (deep nesting, huge integers, non-UTF-8, wrong types)


def test_deep_nesting_is_refused_in_configs_and_plan_files(tmp_path):
    deep = tmp_path / "config.json"
    deep.write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    audit(str(deep), "nested more than")
    plan = tmp_path / "plan.json"
    plan.write_text("[" * 100_000 + "]" * 100_000)
    refused("audit", "--model", "tiny-llama", "--tp", "2", "--plan", str(plan), match="nested more than")
    just_over = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    with pytest.raises(TpplanError, match="nested more than"):
        parse_json(just_over, "x", "fix")
    parse_json("[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1), "x", "fix")  # within the limit: parses


def test_a_5000_digit_integer_is_refused_whatever_the_int_digit_limit(tmp_path):
    path = config(tmp_path)
    Path(path).write_text(Path(path).read_text().replace('"vocab_size": 128', '"vocab_size": 1' + "0" * 5000))
    audit(path, "integer of 5001 digits")
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit: the input layer's own bound still holds
    try:
        with pytest.raises(TpplanError, match="digits"):
            load_json(path, "cfg", "fix")
        with pytest.raises(TpplanError, match="more than 40 digits"):
            parse_toml("x = 1" + "0" * 100, "t.toml", "fix")
    finally:
        sys.set_int_max_str_digits(old)


def test_non_utf8_topology_and_workload_toml(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_bytes(b'name = "\xff\xfe"\n')
    refused("audit", "--model", "tiny-llama", "--tp", "2", "--topology", str(bad), match="not UTF-8")
    refused("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400", "--workload", str(bad),
            match="not UTF-8")  # fmt: skip


def test_gpt_oss_modules_to_not_convert_must_be_strings(tmp_path):
    raw = load_config_dict("tiny-gpt-oss")[0]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": 1}}))
    audit(str(path), "modules_to_not_convert")


# ----------------------------------------------------------------------------------------------
# Items 2 and 3: runtime-only fields are validated; the runtime uses the file's own numerics


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("rms_norm_eps", "abc", "rms_norm_eps"),
        ("rms_norm_eps", -1e-5, "rms_norm_eps"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps"),
        ("rope_theta", "x", "rope_theta"),
        ("rope_theta", -5.0, "rope_theta"),
        ("max_position_embeddings", "x", "max_position_embeddings"),
        ("rope_scaling", {"rope_type": "yarn"}, "needs factor"),
        ("rope_scaling", [1, 2], "rope_scaling"),
        ("rope_scaling", {"rope_type": ["yarn"], "factor": 2.0}, "rope_type: ['yarn'] is not a RoPE scaling"),
        ("rope_parameters", {"rope_type": {"a": 1}}, "rope_type: {'a': 1} is not a RoPE scaling"),
        ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "not a RoPE scaling"),
        ("tie_word_embeddings", "no", "tie_word_embeddings"),
        ("hidden_act", "gelu", "hidden_act"),
        ("intermediate_size", 1e30, "intermediate_size"),
        ("vocab_size", 2**63, "vocab_size"),
        ("hidden_size", "64", "hidden_size"),
    ],
)
def test_a_field_value_the_model_cannot_take_is_refused(tmp_path, field, value, match):
    audit(config(tmp_path, **{field: value}), match)


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-minimax-m2", "tiny-kimi-linear"])
def test_a_router_scoring_other_than_sigmoid_or_softmax_is_refused(tmp_path, preset):
    raw = load_config_dict(preset)[0]
    key = "moe_router_activation_func" if "kimi" in preset else "scoring_func"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, key: "Sigmoid"}))
    audit(str(path), key)


def test_the_runtime_uses_the_numerics_of_the_file_not_of_the_preset_it_names(tmp_path):
    pytest.importorskip("torch")
    from tpplan.models.graph import build_model_graph
    from tpplan.runtime.executor import numerics_for

    path = config(tmp_path, _name_or_path="tiny-mistral", rms_norm_eps=3e-3, rope_theta=12345.0)
    spec = load_model(path)
    assert spec.name == "tiny-mistral"  # the name the file gives itself
    nu = numerics_for(build_model_graph(spec))
    assert nu.eps == 3e-3 and nu.rope_theta == 12345.0  # its own, not tiny-mistral's 1e-5 / 1e6
    assert load_model("tiny-mistral").numerics.eps == 1e-5
    # and its bad eps is refused, not replaced by the named preset's good one
    audit(config(tmp_path, "bad.json", _name_or_path="tiny-mistral", rms_norm_eps="abc"), "rms_norm_eps")


# ----------------------------------------------------------------------------------------------
# Issue 21 item 6: missing fields take transformers' default for the model_type, listed by the audit


def test_gemma3_without_vocab_size_takes_transformers_default(tmp_path):
    raw = load_config_dict("gemma-3-4b-it")[0]
    text = {k: v for k, v in raw["text_config"].items() if k != "vocab_size"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "text_config": text}))
    spec = load_model(str(path))
    assert spec.vocab == 262208  # transformers 5 Gemma3TextConfig.vocab_size
    code, out, err = run("audit", "--model", str(path), "--tp", "2", "--json")
    assert code == 0, err
    notes = json.loads(out)["defaulted"]
    assert any(n.startswith("vocab_size = 262208") and "Gemma3TextConfig" in n for n in notes)
    assert "defaulted" not in json.loads(run("audit", "--model", "deepseek-v3", "--tp", "8", "--json")[1])


# ----------------------------------------------------------------------------------------------
# Items 4 and 9: bounds on workloads and CLI sizes; plan-file nonsense


@pytest.mark.parametrize(
    "text", ["input_len = 1000000000000\nconcurrency = 8\nchunk_size = 8192\n",
             "input_len = 100\nconcurrency = 8\nchunk_size = 64\nnum_requests = 1000000000\n",
             "input_len = 16384\nconcurrency = 8\nchunk_size = 1\nnum_requests = 100000\n"]
)  # fmt: skip
def test_workloads_past_the_bounds_exit_2_at_once(tmp_path, text):
    wl = tmp_path / "w.toml"
    wl.write_text(text)
    refused("audit", "--model", "tiny-llama", "--tp", "2", "--topology", "h200x8-ib400", "--workload", str(wl),
            match=str(wl))  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [("audit", "--tp", "100000"), ("audit", "--tp", "2", "--topology", "h200x8-ib400", "--nodes", str(10**23)),
     ("search", "--tp", "2", "--pp", "0"), ("search", "--tp", "2", "--tokens", str(10**12))],
)  # fmt: skip
def test_cli_sizes_out_of_range_exit_2(args):
    refused(args[0], "--model", "tiny-llama", *args[1:], match="must be at least 1 and at most")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> dict:
    from tpplan.layout.plan import with_ep
    from tpplan.mesh import Mesh
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.files import Deployment, plan_file_data
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-qwen3-moe"))
    return json.loads(
        plan_file_data(
            with_ep(make_plan("baseline", graph, 2), Mesh(2, ep=2)), graph, {}, Deployment(tp=2)
        ).model_dump_json()
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"schema_version": 1.0}, "schema_version 1.0"),
        ({"schema_version": True}, "schema_version True"),
        ({"decisions": {"stream": "R", "reduce": "R", "moe": "ep", "ep_size": 0}}, "ep_size"),
        ({"decisions": {"stream": "R", "reduce": "R", "moe": "ep"}}, "needs ep_size"),
        ({"decisions": {"stream": "R", "reduce": "R", "replicate": ["mla+moe/mla.q_b_proj"]}}, "layer kind 'mla+moe'"),
        ({"deployment": {"tp": 10**30}}, "deployment.tp"),
    ],
)
def test_plan_file_nonsense_is_refused(tmp_path, plan_file, change, match):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan_file, **change}))
    line = refused("audit", "--model", "tiny-qwen3-moe", "--tp", "2", "--plan", str(path), match=match)
    if "layer kind" in match:
        assert "gqa+moe" in line  # the kinds the model has


def test_the_plan_file_itself_still_loads(tmp_path, plan_file):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_file))
    code, _, err = run("audit", "--model", "tiny-qwen3-moe", "--tp", "2", "--plan", str(path))
    assert code == 0, err


# ----------------------------------------------------------------------------------------------
# Item 10: no more local ranks than the machine holds


@pytest.mark.parametrize("command", [("verify", "--tp", "64", "--plan", "baseline"),
                                     ("run", "--tp", "64", "--plan", "baseline")])  # fmt: skip
def test_verify_and_run_refuse_more_ranks_than_the_machine_holds(monkeypatch, command):
    pytest.importorskip("torch")
    from tpplan.commands import _ranks

    monkeypatch.setattr(_ranks, "cpu_cores", lambda: 2)
    monkeypatch.delenv("RANK", raising=False)
    line = refused(command[0], "--model", "tiny-llama", *command[1:], "--backend", "gloo", match="64 local processes")
    assert "at most 4" in line and "--force" in line and "predicted:" in line


def test_bench_refuses_more_ranks_than_the_machine_holds(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from tpplan.commands import _ranks

    monkeypatch.setattr(_ranks, "cpu_cores", lambda: 2)
    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "b.json"
    line = refused("bench", "--model", "tiny-llama", "--plan", "baseline", "--nproc", "9", "--backend", "gloo",
                   "--out", str(out), match="9 local processes")  # fmt: skip
    assert "--force" in line and not out.exists()


def test_k3_mla_layer_with_a_dense_mlp_builds(tmp_path):
    """Found by the fuzz suite: the MLA output gate's value shadowed a dense MLP's `gate` (ValueError)."""
    raw = load_config_dict("tiny-kimi-k3")[0]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "text_config": {**raw["text_config"], "moe_layer_freq": 2}}))
    assert "mla+dense" in load_model(str(path)).layer_kinds()
    code, _, err = run("audit", "--model", str(path), "--tp", "2")
    assert code == 0, err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--plan", "ep2"), "--plan ep2: tiny-llama has no routed experts to spread. Fix: use baseline alone"),
        (("-t", "h200x8-ib400", "--expert-dtype", "mxfp4"),
         "--expert-dtype mxfp4: tiny-llama has no routed experts for it to set. Fix: drop it"),
    ],
)  # fmt: skip
def test_an_expert_option_on_a_model_without_experts_is_refused_not_ignored(args, says) -> None:
    """A dense model took `--plan ep4` (a row equal to baseline) and `--expert-dtype mxfp4` (nothing
    changed) without a word: both are refused in one line naming the option, exit 2."""
    code, _, err = run("audit", "--model", "tiny-llama", "--tp", "2", *args)
    assert code == 2 and says in err and err.count("\n") == 1, err
    code, _, err = run("audit", "--model", "tiny-qwen3-moe", "--tp", "2", *args)
    assert code == 0, err
