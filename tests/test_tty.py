"""100 columns in a real terminal (issue 21): commands run in a pseudo-TTY of 100 columns, where
rich sizes output to the terminal, and every line they print, stdout and stderr, fits."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_tty(args: list[str], cols: int = 100, timeout: float = 300) -> tuple[int, list[str]]:
    """`python -m tpplan ARGS` in a pseudo-terminal `cols` wide: exit code and the lines it printed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's width is in its size and in COLUMNS, as a shell sets both
        os.chdir(ROOT)
        env = {**os.environ, "COLUMNS": str(cols), "PYTHONPATH": str(ROOT)}
        os.execve(sys.executable, [sys.executable, "-m", "tpplan", *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            os.kill(pid, 9)
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    text = ANSI.sub("", out.decode("utf-8", "replace")).replace("\r\n", "\n")
    # a status line redrawn in place (\r) is one line per drawing
    return os.waitstatus_to_exitcode(status), [part for line in text.split("\n") for part in line.split("\r")]


def _fits(lines: list[str], cols: int = 100) -> None:
    assert lines
    long = [line for line in lines if len(line) > cols]
    assert not long, f"{len(long)} line(s) over {cols} columns, e.g. {len(long[0])}: {long[0][:160]}"


@pytest.fixture(scope="module")
def saved_plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans") / "found"
    code, lines = run_tty(["search", "-m", "tiny-kimi-k3", "-t", "h200x8-ib400", "-w", "prompt16k-c8", "--top", "3",
                           "--save", str(out)])  # fmt: skip
    assert code == 0, "\n".join(lines)
    _fits(lines)  # the search table, with its long generated plan names
    return sorted(out.glob("plan-*.json"))


def test_audit_with_saved_plans_fits(saved_plans):
    plans = [x for p in saved_plans for x in ("--plan", str(p))]
    code, lines = run_tty(["audit", "-m", "tiny-kimi-k3", "--tp", "2", "--pp", "1", "--cp", "1", *plans, "-t", "h200x2",
                           "-w", "prompt16k-c8"])  # fmt: skip
    assert code == 0, "\n".join(lines)
    _fits(lines)


def test_report_stdout_fits(tmp_path):
    code, lines = run_tty(["report", "-m", "tiny-deepseek-v3", "-t", "h200x2", "--out", str(tmp_path / "memo")])
    assert code == 0, "\n".join(lines)
    _fits(lines)


def test_an_error_wraps_in_a_terminal():
    code, lines = run_tty(["verify", "-m", "tiny-kimi-k3", "--tp", "2", "--plan", "input-scattered"])
    assert code == 2 and any("pass --force" in line for line in lines), "\n".join(lines)
    _fits(lines)


@pytest.mark.slow
def test_verify_force_fits():
    pytest.importorskip("torch")
    args = ["verify", "-m", "tiny-kimi-k3", "--tp", "2", "--plan", "input-scattered", "--force", "--tokens", "16"]
    code, lines = run_tty(args)
    assert code == 1, "\n".join(lines)  # the forced illegal plan fails its check, as it should
    _fits(lines)
