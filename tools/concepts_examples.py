"""Regenerate the command outputs docs/concepts.md quotes, from what the commands print today.

    python -m tools.concepts_examples          # rewrite the quoted blocks in docs/concepts.md
    python -m tools.concepts_examples --check  # exit 1 if they are stale

Each quoted block is a ```text block whose first line is `$ tpplan ...`; it is replaced by that
command's output, shortened by the block's fixed rule (`SHORTEN`), the rule's `[... ...]` lines saying
what was left out. tests/test_readme_numbers.py checks every quoted line against a fresh run.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from tools.in_process import run_captured

CONCEPTS = Path(__file__).resolve().parents[1] / "docs" / "concepts.md"
BLOCK = re.compile(r"```text\n(\$ tpplan [^\n]*)\n.*?```", re.S)


def _tiny_audit(lines: list[str]) -> list[str]:
    """All of it but the illegal plan's reasons before g_proj's, which say the same of other weights."""
    start = lines.index("input-scattered:") + 1
    end = next(i for i, line in enumerate(lines) if re.match(r"  - \[.*\] g_proj receives", line))
    names = [m[1] for line in lines[start:end] if (m := re.match(r"  - \[.*?\] (\S+) receives", line))]
    marker = f"  [... {len(names)} more reasons of the same shape: {', '.join(names)} ...]"
    return [*lines[:start], marker, *lines[end:]]


def _k3_audit(lines: list[str]) -> list[str]:
    """The header and whole-model table, then the predicted table with the lines under it."""
    first_table_end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    predicted = next(i for i, line in enumerate(lines) if line.strip().startswith("Predicted on"))
    wide = next(i for i, line in enumerate(lines) if line.startswith("(--wide adds"))
    return [
        *lines[: first_table_end + 1],
        "[... per-layer table and the reasons, as in the small example above ...]",
        *lines[predicted : wide + 1],
        "[... per layer of each kind: compute, communication, redundant, slowest ops ...]",
    ]


SHORTEN: dict[str, Callable[[list[str]], list[str]]] = {
    "$ tpplan audit --model tiny-kimi-k3 --tp 2 --plan input-scattered --plan gate-aware": _tiny_audit,
    "$ tpplan audit --model kimi-k3 --tp 32 --topology h200x8-ib400 --nodes 4 --workload prompt16k-c8 "
    "--expert-dtype bf16": _k3_audit,
}


def regenerate(text: str) -> str:
    """`text` with each quoted block replaced by its command's shortened output of today."""

    def block(m: re.Match[str]) -> str:
        head = m[1]
        code, out, err = run_captured(*head.split()[2:])
        if code != 0:
            raise SystemExit(f"{head} failed: {err}")
        lines = [line.rstrip() for line in out.rstrip("\n").splitlines()]
        return "```text\n" + "\n".join([head, *SHORTEN[head](lines)]) + "\n```"

    return BLOCK.sub(block, text)


def main() -> None:
    text = CONCEPTS.read_text()
    new = regenerate(text)
    if "--check" in sys.argv:
        sys.exit(0 if new == text else 1)
    CONCEPTS.write_text(new)


if __name__ == "__main__":
    main()
