"""Golden outputs: the JSON of fixed `tpplan audit` / `search` commands, kept in `tests/golden/` (issue 30).

The refactor of issue 30 must leave what tpplan prints byte-identical, or explain each difference in the
commit that changes it. `COMMANDS` below are fixed commands over several models (DeepSeek-V3 and V3.2,
Kimi-K3, Kimi-Linear, Llama-3-70B, Qwen3-32B, Qwen3-Next, Mixtral, GLM-5.1, gpt-oss) and the axes and
rewrites the planner knows (TP, PP, CP with both `--cp-layers`, EP and all-to-all, DP attention, tbo and
async TP overlap, replicas, Poisson arrivals through the serving loop, `--engine sglang|vllm|trtllm`).
Each one's output is stored as `tests/golden/<name>.json`: `{"command": ..., "output": <the CLI's JSON>}`,
pretty-printed (indent 1) so that a diff of a regenerated file reads key by key. The three example memos
(`docs/examples/`) are golden outputs too: their checked-in `report.md` is the stored file, and their
commands are read from `docs/examples/README.md`, so nothing is stored twice.

Usage (from the repository root):
    python -m tools.golden --check            # every command; a per-command summary; exit 1 on a difference
    python -m tools.golden --write            # regenerate tests/golden/ and the example memos
    python -m tools.golden --check --quick    # the quick subset (`QUICK`) that tests/test_golden_outputs.py runs
    python -m tools.golden --check NAME ...   # some commands (names as in tests/golden/, `memo:<dir>` for a memo)
    python -m tools.golden --check --subprocess   # each command in its own `python -m tpplan` process

Commands run in this process through `tpplan.cli.main()` (the CLI's own entry point: the stored JSON is
what `tpplan ...` prints on stdout, parsed and pretty-printed), about twice as fast as a new interpreter
per command; `--subprocess` runs each one as `python -m tpplan` to show both give the same files. The
memos always run as a subprocess, in a scratch copy of the repository's layout so that their command line,
which the memo quotes, is the documented one verbatim.

Normalised, and only these, because they legitimately differ between two runs of the same code:
- `search.seconds` in `search --json` (the search's wall-clock time): replaced by `"<wall-clock>"`.
- Absolute paths of this checkout (the repository root, as a string prefix): replaced by `<repo>`, so
  the files do not depend on where the repository was cloned. (None of today's commands prints one.)
Versions are not normalised: the only ones printed are the JSON schema version and the engines' and
AIConfigurator's data versions, and a change of those changes prices, which is a difference to explain.
AIConfigurator's answer cache is pointed at a fresh scratch folder for the run (`TPPLAN_CACHE_DIR`), so
the engine commands price from AIConfigurator itself, not from an answer cached by older code;
`--cache DIR` uses DIR instead (run twice with the same DIR to check the cached answers too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.in_process import run_captured

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ROOT / "docs" / "examples"
K3_4X8 = "-m kimi-k3 -t h200x8-ib400 --nodes 4 --expert-dtype mxfp4 -w seed-c8"

COMMANDS: dict[str, str] = {  # name (the file tests/golden/<name>.json) -> the command after `tpplan`
    # audit: plans op by op, bytes only (no topology)
    "audit-deepseek-v3-tp8-bytes": "audit -m deepseek-v3 --tp 8 --json -",
    # audit with a topology and workload: prediction, memory, serving loop
    "audit-deepseek-v3-tp8": "audit -m deepseek-v3 -t h200x8-ib400 -w prompt16k-c8 --json -",
    "audit-llama-3-70b-tp8": "audit -m llama-3-70b -t h200x8-ib400 --json -",
    "audit-kimi-k3-tp32-ep": f"audit {K3_4X8} --tp 32 -p baseline -p ep4 -p sglang-sp-moe --json -",
    "audit-kimi-k3-tp8-pp4": f"audit {K3_4X8} --tp 8 --pp 4 -p baseline -p sglang-sp-moe --json -",
    "audit-deepseek-v3-cp2-all": "audit -m deepseek-v3 -t h200x8-ib400 --nodes 2 -w prompt128k-c4 --cp 2 "
    "-p baseline --json -",
    "audit-deepseek-v3-cp2-mla": "audit -m deepseek-v3 -t h200x8-ib400 --nodes 2 -w prompt128k-c4 --cp 2 "
    "--cp-layers mla -p baseline --json -",
    "audit-qwen3-next-tp4-cp2-serial": "audit -m qwen3-next-80b -t h200x8-ib400 -w prompt16k-c8 --tp 4 --cp 2 "
    "--cp-recurrence serial -p baseline -p sequence-parallel --json -",
    "audit-mixtral-ep8-a2a": "audit -m mixtral-8x7b -t h200x8-ib400 -w prompt16k-c8 -p baseline -p ep8 -p sp-moe "
    "--json -",
    "audit-llama-3-70b-replicas2": "audit -m llama-3-70b -t h200x8-ib400 --nodes 2 -w prompt16k-c16 --replicas 2 "
    "-p baseline -p sequence-parallel --json -",
    "audit-qwen3-32b-arrivals": "audit -m qwen3-32b -t h200x8-ib400 -w prompt16k-c8 --arrival-rate 2 --requests 50 "
    "-p baseline --json -",
    "audit-glm-5.1-tp16-dsa": "audit -m glm-5.1 -t h200x8-ib400 --nodes 2 -w prompt16k-c8 --tp 16 -p baseline "
    "-p sp-moe --json -",
    "audit-deepseek-v3.2-tbo": "audit -m deepseek-v3.2 -t h200x8-ib400 -w prompt16k-c8 -p baseline -p sp-moe+tbo "
    "--json -",
    "audit-llama-3-70b-asynctp": "audit -m llama-3-70b -t h200x8-ib400 -w prompt16k-c8 -p sequence-parallel "
    "-p sequence-parallel+asynctp --json -",
    "audit-kimi-linear-crossover": "audit -m kimi-linear-48b -t h200-serving -w prompt16k-c8 -p baseline "
    "-p sp-moe --crossover --json -",
    # audit priced from the engines' measured kernels (AIConfigurator)
    "audit-qwen3-32b-sglang": "audit -m qwen3-32b -t h200x8-ib400 -w prompt16k-c8 -p baseline --engine sglang --json -",
    "audit-deepseek-v3-trtllm": "audit -m deepseek-v3 -t h200x8-ib400 -w prompt16k-c8 -p baseline -p sp-moe "
    "--engine trtllm --json -",
    # search: ranked plans and deployments
    "search-qwen3-32b-tp-pp": "search -m qwen3-32b -t h200x8-ib400 --top 3 --json -",
    "search-deepseek-v3-dp-attention": "search -m deepseek-v3 -t h200x8-ib400 --nodes 2 -w prompt16k-c8 "
    "--dp-attention --top 3 --json -",
    "search-deepseek-v3-tbo": "search -m deepseek-v3 -t h200x8-ib400 -w prompt16k-c8 --overlap tbo --top 3 --json -",
    "search-qwen3-32b-asynctp": "search -m qwen3-32b -t h200x8-ib400 -w prompt16k-c8 --overlap asynctp --top 3 "
    "--json -",
    "search-llama-3-70b-replicas": "search -m llama-3-70b -t h200x8-ib400 --nodes 2 -w prompt16k-c16 "
    "--replicas all --top 3 --json -",
    "search-gpt-oss-120b-volume": "search -m gpt-oss-120b -t h200x8-ib400 --objective volume --top 3 --json -",
    "search-qwen3-32b-cp4": "search -m qwen3-32b -t h200x8-ib400 --nodes 2 -w prompt128k-c4 --cp 4 --top 3 --json -",
    "search-kimi-k3-tp8-pp4": f"search {K3_4X8} --tp 8 --pp 4 --top 3 --json -",
    "search-qwen3-32b-vllm": "search -m qwen3-32b -t h200x8-ib400 -w prompt16k-c8 --engine vllm --top 3 --json -",
}
QUICK = ("audit-deepseek-v3-tp8-bytes", "audit-llama-3-70b-tp8", "audit-deepseek-v3-cp2-mla")
WALL_CLOCK = (("search", "seconds"),)  # key paths of wall-clock times, replaced by "<wall-clock>"
MEMO = "memo:"  # prefix of a memo's name: memo:<folder under docs/examples>
SHOWN = 8  # differences listed per command in the summary


def memo_commands() -> dict[str, str]:
    """The example memos' documented commands (docs/examples/README.md), by `memo:<folder>`."""
    text = (EXAMPLES / "README.md").read_text()
    found = re.findall(r"^(tpplan report .*--out docs/examples/(\S+))$", text, flags=re.M)
    return {MEMO + folder: line for line, folder in found}


def normalise(data: Any, path: tuple[str, ...] = ()) -> Any:
    """`data` with wall-clock times and this checkout's absolute paths replaced (module docstring)."""
    if path in WALL_CLOCK:
        return "<wall-clock>"
    if isinstance(data, dict):
        return {k: normalise(v, (*path, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [normalise(v, path) for v in data]
    if isinstance(data, str):
        return data.replace(str(ROOT), "<repo>")
    return data


def run_cli(args: list[str], subprocess_: bool) -> tuple[int, str, str]:
    """`tpplan ARGS`: (exit code, stdout, stderr), in this process through cli.main() or in a new one."""
    if subprocess_:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "tpplan", *args], capture_output=True, text=True, env=env)
        return done.returncode, done.stdout, done.stderr
    return run_captured(*args)


def render(name: str, subprocess_: bool = False) -> str:
    """The golden file's text for COMMANDS[name], as the CLI prints it today."""
    command = COMMANDS[name]
    code, out, err = run_cli(shlex.split(command), subprocess_)
    if code != 0:
        raise RuntimeError(f"`tpplan {command}` exited {code}: {err.strip()[-500:]}")
    doc = {"command": f"tpplan {command}", "output": normalise(json.loads(out))}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def render_memo(name: str, scratch: Path) -> str:
    """The report.md that the memo's documented command writes today, run in `scratch`: a folder with
    the repository's docs/benchmarks linked in, so its relative paths and its quoted command line are
    the documented ones."""
    command = memo_commands()[name]
    (scratch / "docs" / "examples").mkdir(parents=True, exist_ok=True)
    if not (scratch / "docs" / "benchmarks").exists():
        (scratch / "docs" / "benchmarks").symlink_to(ROOT / "docs" / "benchmarks")
    out = scratch / "docs" / "examples" / name.removeprefix(MEMO)
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tpplan", *shlex.split(command)[1:]]
    done = subprocess.run(args, cwd=scratch, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"`{command}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return (out / "report.md").read_text()


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, one line per differing leaf: `path: old -> new`. A list of objects
    that all have a "name" is indexed by name (`plans[baseline]`), so a reordering reads as one."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = [f"{path}.{k}: added" for k in new if k not in old]
        found += [f"{path}.{k}: removed" for k in old if k not in new]
        for k in old:
            if k in new:
                found += differences(old[k], new[k], f"{path}.{k}")
        if not found and list(old) != list(new):
            found.append(f"{path}: same keys, new order")
        return found
    if isinstance(old, list) and isinstance(new, list):
        if _named(old) and _named(new):
            names = [o["name"] for o in old], [n["name"] for n in new]
            if names[0] != names[1]:
                return [f"{path}: names {names[0]} -> {names[1]}"]
        if len(old) != len(new):
            return [f"{path}: {len(old)} items -> {len(new)}"]
        keys = [o["name"] if _named(old) else i for i, o in enumerate(old)]
        return [d for k, o, n in zip(keys, old, new, strict=True) for d in differences(o, n, f"{path}[{k}]")]
    if old != new or type(old) is not type(new):
        return [f"{path}: {_short(old)} -> {_short(new)}"]
    return []


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def text_differences(old: str, new: str) -> list[str]:
    """Where two memos differ: the first differing lines, by line number."""
    a, b = old.splitlines(), new.splitlines()
    found = [f"line {i + 1}: {_short(x)} -> {_short(y)}" for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
    if len(a) != len(b):
        found.append(f"{len(a)} lines -> {len(b)}")
    return found


def compare(name: str, scratch: Path, subprocess_: bool = False, golden: Path = GOLDEN) -> list[str]:
    """The differences between the stored golden output of `name` (in `golden`) and what tpplan prints
    today."""
    if name.startswith(MEMO):
        stored = EXAMPLES / name.removeprefix(MEMO) / "report.md"
        return text_differences(stored.read_text(), render_memo(name, scratch))
    path = golden / f"{name}.json"
    if not path.exists():
        return [f"{path} is missing: run `python -m tools.golden --write {name}`"]
    new = render(name, subprocess_)
    stored_text = path.read_text()
    if new == stored_text:
        return []
    found = differences(json.loads(stored_text), json.loads(new))
    return found or ["same values, different bytes (formatting or key order)"]


def write(name: str, subprocess_: bool = False) -> None:
    """Regenerate the golden output of `name`: its file, or for a memo its documented command."""
    if name.startswith(MEMO):
        args = [sys.executable, "-m", "tpplan", *shlex.split(memo_commands()[name])[1:]]
        subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return
    GOLDEN.mkdir(exist_ok=True)
    (GOLDEN / f"{name}.json").write_text(render(name, subprocess_))


def check(names: list[str], subprocess_: bool = False, echo: bool = True) -> dict[str, list[str]]:
    """Compare every name; print one line per command (and its first differences); the differences."""
    found: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="tpplan-golden-") as scratch:
        for name in names:
            found[name] = compare(name, Path(scratch), subprocess_)
            if echo:
                diffs = found[name]
                print(f"{'ok  ' if not diffs else 'DIFF'} {name}" + (f" ({len(diffs)} differences)" if diffs else ""))
                for line in diffs[:SHOWN]:
                    print(f"       {line}")
                if len(diffs) > SHOWN:
                    print(f"       ... and {len(diffs) - SHOWN} more")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.golden", description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare with tests/golden/; exit 1 on a difference")
    mode.add_argument("--write", action="store_true", help="regenerate tests/golden/ and the example memos")
    ap.add_argument("--quick", action="store_true", help="only the quick subset (QUICK)")
    ap.add_argument("--subprocess", action="store_true", help="run each command as `python -m tpplan`")
    ap.add_argument("--no-memos", action="store_true", help="leave out the example memos")
    ap.add_argument("--cache", metavar="DIR", help="AIC answer cache folder to use (default: a fresh scratch one)")
    ap.add_argument("names", nargs="*", help="commands to run (default: all)")
    args = ap.parse_args(argv)
    every = [*COMMANDS, *([] if args.no_memos else memo_commands())]
    names = args.names or (list(QUICK) if args.quick else every)
    unknown = [n for n in names if n not in COMMANDS and n not in memo_commands()]
    if unknown:
        ap.error(f"unknown command name(s) {unknown}; known: {every}")
    cache = tempfile.TemporaryDirectory(prefix="tpplan-golden-cache-")
    os.environ["TPPLAN_CACHE_DIR"] = args.cache or cache.name  # by default AIC itself, not a cached answer
    try:
        if args.write:
            for name in names:
                write(name, args.subprocess)
                print(f"wrote {name}")
            return 0
        failed = [n for n, d in check(names, args.subprocess).items() if d]
        print(f"{len(names) - len(failed)} of {len(names)} unchanged" + (f"; changed: {failed}" if failed else ""))
        return 1 if failed else 0
    finally:
        cache.cleanup()


if __name__ == "__main__":
    sys.exit(main())
