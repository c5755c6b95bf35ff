"""The engines' own argument parsers accept every launch line the memo prints, with the settings
the plan says (issue 24).

SGLang's `prepare_server_args` runs on a CPU machine: install `sglang==0.5.23` with `--no-deps` plus
its import-time dependencies (docs/engines.md, "Checking launch lines"), or point
`TPPLAN_SGLANG_PATH` at a folder holding them; vLLM's `EngineArgs` likewise (`TPPLAN_VLLM_PATH`,
docs/engines.md). Without an engine its tests are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.models.config import load_model
from tpplan.models.spec import MoESpec
from tpplan.report.analysis import analyse
from tpplan.report.memo import build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk

LAUNCH = "python -m sglang.launch_server"
KEYS = (
    "tp_size", "pp_size", "ep_size", "enable_dp_attention", "moe_a2a_backend", "enable_attn_tp_input_scattered",
    "enable_layernorm_sp", "chunked_prefill_size", "nnodes", "attn_cp_size", "enable_prefill_cp", "deepep_mode",
)  # fmt: skip
PROBE = f"""
import json, os, sys
from sglang.srt.server_args import prepare_server_args
out = []
for env, argv in json.loads(sys.stdin.read()):
    os.environ.update(env)
    a = prepare_server_args(argv)
    out.append({{k: getattr(a, k) for k in {KEYS!r}}})
    for k in env:
        del os.environ[k]
print("RESULT " + json.dumps(out))
"""


def _env() -> dict[str, str]:
    extra = os.environ.get("TPPLAN_SGLANG_PATH", "")
    path = os.pathsep.join(p for p in (extra, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@cache
def _sglang_importable() -> bool:
    code = "import sglang.srt.server_args"
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True).returncode == 0


def _parse(lines: list[tuple[dict[str, str], list[str]]]) -> list[dict[str, object]]:
    res = subprocess.run(
        [sys.executable, "-c", PROBE], input=json.dumps(lines), env=_env(), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """A memo line as (environment, argv for prepare_server_args), placeholders filled."""
    command = command.replace("<model-path>", "x").replace("<head-ip>:<port>", "127.0.0.1:5000")
    command = re.sub(r"<0\.\.\d+>", "0", command)
    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    assert " ".join(words[:3]) == LAUNCH, command
    return env, words[3:]


CASES = (("deepseek-v3", 1, 8), ("kimi-k3", 4, 32), ("qwen3-32b", 1, 8))


def _expert_dtype(model: str) -> str | None:
    """mxfp4 experts where the model has routed experts (an expert option on a dense model is refused)."""
    return "mxfp4" if any(isinstance(layer.mlp, MoESpec) for layer in load_model(model).layers) else None


@cache
def _memo_lines(model: str, nodes: int, tp: int):
    a = analyse(
        model,
        load_topology("h200x8-ib400", nodes=nodes),
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=tp), expert_dtype=_expert_dtype(model)),
        use_default_predictor=False,
    )
    text = build_memo(a, "").markdown
    printed = [x for x in re.findall(r"```bash\n(.*?)\n```", text, re.S) if LAUNCH in x]
    recipes = {e.command(): (v, e) for v in a.variants for e in v.engines if e.engine == "SGLang" and e.command()}
    return printed, recipes


@pytest.mark.parametrize("model,nodes,tp", CASES)
def test_every_sglang_line_the_memo_prints_is_a_recipe(model, nodes, tp):
    printed, recipes = _memo_lines(model, nodes, tp)
    assert printed, "the memo prints no SGLang launch line"
    assert all(line in recipes for line in printed)


@pytest.mark.slow  # one SGLang import in a subprocess (~40 s on CPU); needs the optional install
def test_sglang_parses_every_line_with_the_plans_settings():
    if not _sglang_importable():
        pytest.skip("sglang is not importable (install sglang==0.5.23 --no-deps and its import-time deps)")
    cases = []
    for model, nodes, tp in CASES:
        printed, recipes = _memo_lines(model, nodes, tp)
        cases += [(line, nodes, *recipes[line]) for line in sorted(set(printed) | set(recipes))]
    parsed = _parse([_argv(line) for line, *_ in cases])
    for (line, nodes, v, e), got in zip(cases, parsed, strict=True):
        args = " ".join(e.args)
        assert got["tp_size"] == v.tp and got["pp_size"] == v.pp, line
        assert got["nnodes"] == nodes and got["chunked_prefill_size"] > 0, line
        assert got["enable_dp_attention"] is False, line
        assert got["enable_attn_tp_input_scattered"] is ("--enable-attn-tp-input-scattered" in args), line
        assert got["enable_layernorm_sp"] is ("--enable-layernorm-sp" in args), line
        backend = re.search(r"--moe-a2a-backend (\S+)", args)
        assert got["moe_a2a_backend"] == (backend[1] if backend else "none"), line
        ep = re.search(r"--ep-size (\d+)", args)
        # The a2a backends' ep_size = tp_size is a post-process after parsing (the memo says so).
        assert got["ep_size"] == (int(ep[1]) if ep else 1), line
        if backend and backend[1] == "deepep":
            assert any("_a2a_ep_size" in c.source for c in e.conditions), "the memo must say what SGLang derives"


VLLM_LAUNCH = "vllm serve"
VLLM_PROBE = """
import json, sys
from vllm.engine.arg_utils import EngineArgs, FlexibleArgumentParser
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
out = []
for argv in json.loads(sys.stdin.read()):
    e = EngineArgs.from_cli_args(parser.parse_args(argv))
    out.append({k: getattr(e, k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                                            "enable_expert_parallel", "all2all_backend", "max_num_batched_tokens")})
print("RESULT " + json.dumps(out, default=str))
"""


def _vllm_env() -> dict[str, str]:
    extra = os.environ.get("TPPLAN_VLLM_PATH", "")
    path = os.pathsep.join(p for p in (extra, os.environ.get("PYTHONPATH", "")) if p)
    # The PyPI wheel is a CUDA build; on a machine without a GPU its DeviceConfig cannot infer a
    # device unless told to take the CPU platform (parsing only; nothing runs).
    return {**os.environ, "PYTHONPATH": path, "VLLM_TARGET_DEVICE": "cpu"}


@pytest.mark.slow  # one vLLM import in a subprocess; needs the optional install
def test_vllm_parses_every_line_with_the_plans_settings(tmp_path):
    code = "from vllm.engine.arg_utils import EngineArgs"
    if subprocess.run([sys.executable, "-c", code], env=_vllm_env(), capture_output=True).returncode:
        pytest.skip("vllm is not importable (install vllm==0.33.0 --no-deps and its import-time deps)")
    cases = []
    for model, nodes, tp in CASES:
        a = analyse(
            model,
            load_topology("h200x8-ib400", nodes=nodes),
            [load_workload("seed-c8")],
            MemoAsk(deployment=MeshAsk(tp=tp), expert_dtype=_expert_dtype(model), search_top=0),
            use_default_predictor=False,
        )
        cases += [(v, e) for v in a.variants for e in v.engines if e.engine == "vLLM" and e.command()]
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    argv = []
    for _, e in cases:
        words = shlex.split(e.command(str(tmp_path)))  # a local folder: the parser looks nothing up
        assert " ".join(words[:2]) == VLLM_LAUNCH
        argv.append(["--model", words[2], *words[3:]])
    res = subprocess.run([sys.executable, "-c", VLLM_PROBE], input=json.dumps(argv), env=_vllm_env(),
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    parsed = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))
    for (v, e), got in zip(cases, parsed, strict=True):
        args = " ".join(e.args)
        assert got["tensor_parallel_size"] == v.tp and got["pipeline_parallel_size"] == v.pp, args
        dp = re.search(r"--data-parallel-size (\d+)", args)
        assert got["data_parallel_size"] == (int(dp[1]) if dp else 1), args
        assert got["enable_expert_parallel"] is ("--enable-expert-parallel" in args), args
        backend = re.search(r"--all2all-backend (\S+)", args)
        if backend:
            assert got["all2all_backend"] == backend[1], args


@pytest.mark.slow
def test_vllm_0_33_refuses_the_sequence_parallelism_pass_config(tmp_path):
    """The engine data says vLLM 0.33.0 has no `pass_config.enable_sp`: its own parser must refuse it."""
    from tpplan.engines import select

    assert not select("vllm@0.33.0").mode("sp-pass").exists
    code = "from vllm.engine.arg_utils import EngineArgs"
    if subprocess.run([sys.executable, "-c", code], env=_vllm_env(), capture_output=True).returncode:
        pytest.skip("vllm is not importable")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    probe = (
        "from vllm.engine.arg_utils import EngineArgs, FlexibleArgumentParser\n"
        "p = EngineArgs.add_cli_args(FlexibleArgumentParser())\n"
        f"EngineArgs.from_cli_args(p.parse_args(['--model', {str(tmp_path)!r}, '--tensor-parallel-size', '8', "
        "'--compilation-config', '{\"pass_config\": {\"enable_sp\": true}}']))\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], env=_vllm_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "enable_sp" in res.stderr
