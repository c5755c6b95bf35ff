"""The CLI: readable output, JSON, and one clear error with exit code 2 for bad input."""

import json
import re
import subprocess
import sys

import pytest

from tpplan.models.config import load_config_dict


def run(*args, check=False):
    return subprocess.run([sys.executable, "-m", "tpplan", *args], capture_output=True, text=True, check=check)


def test_audit_table_and_explain():
    out = run("audit", "--model", "kimi-k3", "--tp", "32", check=True).stdout
    assert "input-scattered" in out and "9280" in out and "g_proj" in out
    exp = run("explain", "--model", "kimi-k3", "--tp", "32", "--plan", "input-scattered", check=True).stdout
    assert "!! g_proj" in exp and "--AG-->" in exp and "--RS-->" in exp


def test_audit_json():
    data = json.loads(run("audit", "--model", "deepseek-v3", "--tp", "8", "--json", check=True).stdout)
    assert {p["name"] for p in data["plans"]} >= {"baseline", "input-scattered", "gate-aware"}


def test_sp_moe_alias_is_accepted_but_never_printed():
    """`moe-a2a` is the older name of SGLang's SP-MoE plan: it still selects the plan, but the table and
    the JSON only ever name it `sp-moe`."""
    args = ("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", "moe-a2a")
    out = run(*args, check=True).stdout
    data = json.loads(run(*args, "--json", check=True).stdout)
    assert [p["name"] for p in data["plans"]] == ["baseline", "sp-moe"]  # baseline: the reference
    plan_name = re.compile(r"(?<![-\w])moe-a2a(?![-\w])")  # not SGLang's --moe-a2a-backend flag
    assert "sp-moe" in out and not plan_name.search(out) and not plan_name.search(json.dumps(data))
    exp = run("explain", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", "moe-a2a", check=True).stdout
    assert exp.startswith("sp-moe ") and not plan_name.search(exp)


def test_models_lists_presets():
    assert "kimi-k3" in run("models", check=True).stdout


def _write(tmp_path, text):
    p = tmp_path / "config.json"
    p.write_text(text)
    return str(p)


def _k3_with(**changes):
    raw, _ = load_config_dict("kimi-k3")
    raw["text_config"].update(changes)
    return json.dumps(raw)


BAD = {
    "truncated": ('{"model_type": "deepseek_v3", "hidden_size": 71', "malformed JSON"),
    "not-object": ("[1, 2]", "expected a JSON object"),
    "unknown-type": ('{"model_type": "gpt9"}', "unknown model_type"),
    "no-type": ('{"hidden_size": 8}', "'model_type' is missing"),
    "missing-field": ('{"model_type": "deepseek_v3", "hidden_size": 64}', "is missing"),
    "bad-value": (None, "hidden_size"),
    "layers-uncovered": (None, "do not cover all 93 layers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_files(case, tmp_path):
    text, expect = BAD[case]
    if case == "bad-value":
        text = _k3_with(hidden_size=-1)
    if case == "layers-uncovered":
        raw, _ = load_config_dict("kimi-k3")
        raw["text_config"]["linear_attn_config"]["kda_layers"] = raw["text_config"]["linear_attn_config"]["kda_layers"][
            :-1
        ]
        text = json.dumps(raw)
    r = run("audit", "--model", _write(tmp_path, text), "--tp", "8")
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and "Fix:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--model", "kimi-k3", "--tp", "64"), "96 heads cannot be split evenly over 64 ranks"),
        (("--model", "kimi-k3", "--tp", "0"), "at least 1"),
        (("--model", "kimi-k3", "--tp", "8", "--plan", "nope"), "unknown plan"),
        (("--model", "no-such-model", "--tp", "8"), "no such preset or file"),
    ],
)
def test_bad_arguments(args, expect):
    r = run("audit", *args)
    assert r.returncode == 2 and expect in r.stderr and "Traceback" not in r.stderr


def test_audit_with_topology_and_workload():
    args = ("audit", "--model", "kimi-k3", "--tp", "32", "-p", "gate-aware", "-t", "h200x8-ib400", "-w", "seed-c16")
    out = run(*args, check=True).stdout
    assert "Predicted on h200x8-ib400" in out and "TTFT mean" in out and "gate-aware" in out
    data = json.loads(run(*args, "--json", check=True).stdout)
    assert data["schema_version"] == 3 and data["workload"] == "prompt16k-c16"
    pr = data["plans"][-1]["prediction"]
    assert pr["ttft"]["mean_s"] > 0 and pr["memory_bytes_per_rank"]["replicated_extra"] > 0
    pp = json.loads(
        run(
            "audit",
            "--model",
            "kimi-k3",
            "--tp",
            "8",
            "-p",
            "baseline",
            "-t",
            "h200x8-ib400",
            "--pp",
            "4",
            "--json",
            check=True,
        ).stdout
    )
    assert pp["pp"] == 4 and pp["plans"][0]["prediction"]["stage_comm_s"] > 0


@pytest.mark.parametrize(
    ("opt", "text", "expect"),
    [
        ("--topology", "nodes = 2\ngpus_per_node = 0\n", "required field 'name' is missing"),
        ("--topology", "name = [unclosed\n", "malformed TOML"),
        ("--workload", "input_len = 16384\nconcurrency = 0\nchunk_size = 8192\n", "concurrency"),
        ("--workload", "input_len = 1\nconcurrency = 1\nchunk_size = 8\nbogus = 1\n", "bogus"),
    ],
)
def test_bad_topology_and_workload_files(tmp_path, opt, text, expect):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    extra = ("--topology", "h200x8-ib400") if opt == "--workload" else ()
    r = run("audit", "--model", "kimi-k3", "--tp", "32", "-p", "baseline", *extra, opt, str(p))
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and "bad.toml" in r.stderr and "Traceback" not in r.stderr


def test_prediction_options_need_a_topology():
    r = run("audit", "--model", "kimi-k3", "--tp", "32", "--workload", "seed-c8")
    assert r.returncode == 2 and "need a topology" in r.stderr and "Traceback" not in r.stderr
    r = run("audit", "--model", "kimi-k3", "--tp", "32", "-t", "h200x8-ib400", "--nodes", "4", "--pp", "2")
    assert r.returncode == 2 and "needs 64 GPUs" in r.stderr and "Traceback" not in r.stderr


def test_json_means_the_same_on_audit_and_search(tmp_path):
    """`--json` alone or `--json -` prints the object and nothing else; `--json FILE` writes FILE and
    the tables still print."""
    audit = ("audit", "--model", "tiny-llama", "--tp", "2")
    search = ("search", "--model", "tiny-llama", "--tp", "2", "--objective", "volume", "--top", "2")
    for args in (audit, search):
        for flag in (["--json"], ["--json", "-"], ["--json", "--wide"]):
            r = run(*args, *flag, check=True)
            assert json.loads(r.stdout)["model"] == "tiny-llama"
        out = tmp_path / f"{args[0]}.json"
        r = run(*args, "--json", str(out), check=True)
        assert json.loads(out.read_text())["model"] == "tiny-llama" and not r.stdout.lstrip().startswith("{")
