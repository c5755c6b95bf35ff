"""Library errors name fields (`tp=7`, `cp_layers=mla`), never the CLI's options (`--tp 7`).

The rule, exactly: in every module of `tpplan/` except `tpplan/commands/` and `tpplan/cli.py`, no string
constant inside a call of `TpplanError`, or of the error builders `unknown_name`, `from_validation` and
`validated` (`tpplan.errors`), contains a `--name` word; the parts of an f-string count, and so does every
string anywhere inside the call's arguments (a conditional, a join, a nested f-string). The CLI writes each
`field=value` as its option (`cli.FLAG_OF`, `cli.as_flags`), so the user still reads `--tp 7`.

Not errors, so not scanned: docstrings, comments, and strings outside those calls, such as the launch lines
of engines (`--tp-size` is SGLang's flag, data about SGLang, not an option of tpplan). Inside an error, an
engine's command line may still be quoted whole, in backticks that start with the engine's launcher
(`python -m sglang...`, `vllm serve ...`): that is a fact about the engine, not a tpplan option.

`PENDING` lists the modules other engineers were editing when this rule came in, with how many such strings
each still has; the count may only go down (lower it, or drop the entry, when they are converted).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpplan"
ERROR_CALLS = {"TpplanError", "unknown_name", "from_validation", "validated"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ENGINE_LINE = re.compile(r"`(?:python3? -m sglang|sglang |vllm serve)[^`]*`")

PENDING = {  # module: strings with a `--flag` still there (under active edit elsewhere on 2026-12-06)
    "bench/calibrate.py": 5,
    "cost/gpu.py": 2,
    "cost/topology.py": 3,
    "cost/workload.py": 1,
    "models/config.py": 2,
    "plans/files.py": 5,
    "report/analysis.py": 5,
    "report/memo_variants.py": 4,  # moved from report/analysis.py with parse_current/current_variant
    "runtime/group.py": 1,
}


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def flag_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string constant inside an error call of `source` that names a `--flag`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _name(node) in ERROR_CALLS:
            for sub in ast.walk(node):
                text = sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else ""
                if FLAG.search(ENGINE_LINE.sub("", text)):
                    found.append((sub.lineno, text))
    return sorted(set(found))


def library_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] != "commands" and p.relative_to(PACKAGE).as_posix() != "cli.py"
    ]


def test_no_flag_strings_in_library_errors():
    counts: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for path in library_modules():
        rel = path.relative_to(PACKAGE).as_posix()
        for line, text in flag_strings(path.read_text()):
            counts[rel] += 1
            where.setdefault(rel, []).append(f"{rel}:{line}: {text!r}")
    over = [hit for rel, n in counts.items() if n > PENDING.get(rel, 0) for hit in where[rel]]
    assert not over, "library errors name fields (tp=7), the CLI maps them (cli.FLAG_OF):\n" + "\n".join(over)
    stale = {rel: n for rel, n in PENDING.items() if counts[rel] < n}
    assert not stale, f"fewer --flag strings than PENDING says; lower it to {dict(counts)}"


def test_the_scan_sees_what_it_should():
    """It catches f-string parts and strings nested in the call, and passes an engine's launch line."""
    bad = 'raise TpplanError(f"--tp {n}", "r", "f" if x else "pass --cp 2")\nunknown_name("a", b, [], "--model", "l")'
    assert [line for line, _ in flag_strings(bad)] == [1, 1, 2]
    ok = (
        'raise TpplanError(f"tp={n}", "SGLang needs `python -m sglang.launch_server --tp-size 8`", "pass cp=2")\n'
        'LAUNCH = "--tp-size 8"  # data about an engine, outside any error\n'
        'raise TpplanError("x", "no--flag here", "1--2")'
    )
    assert flag_strings(ok) == []


def test_every_field_a_library_error_names_maps_to_a_cli_option():
    """The CLI turns each converted field into the flag the user typed, so the message reads as before."""
    from tpplan.cli import as_flags
    from tpplan.errors import TpplanError

    cases = {
        (
            "tp=8 cp=3 cp_layers=mla",
            "r",
            "use cp_layers=all",
        ): "--tp 8 --cp 3 --cp-layers mla: r. Fix: use --cp-layers all",
        (
            "iters=/warmup=",
            "r",
            "pass plan=NAME (repeatable)",
        ): "--iters/--warmup: r. Fix: pass --plan NAME (repeatable)",
        (
            "from_files= a.json",
            "r",
            "drop engine=, or pass topology=",
        ): "--from a.json: r. Fix: drop --engine, or pass --topology",
        ("plan 'x' (tp=7)", "r", "pass force= to run it"): "plan 'x' (--tp 7): r. Fix: pass --force to run it",
    }
    for parts, shown in cases.items():
        assert str(as_flags(TpplanError(*parts))) == shown
