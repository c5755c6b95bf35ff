"""Long commands show progress in a file or pipe too: plain lines on stderr at a modest rate, none for
a quick run (issue 33: a 17 s `report` printed nothing to a log until it ended)."""

from __future__ import annotations

import io

from cli_helpers import run_cli
from rich.console import Console

from tpplan.commands import _console
from tpplan.commands._console import EVERY_S, QUIET_S, PlainSteps


def test_plain_steps_wait_then_print_at_most_one_line_every_few_seconds(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(_console.time, "perf_counter", lambda: clock[0])
    buf = io.StringIO()
    say = PlainSteps(Console(file=buf, width=100), "tpplan report m")
    for t, step in [(0.5, "a"), (QUIET_S + 0.5, "b"), (QUIET_S + 1.0, "c"), (QUIET_S + EVERY_S + 1.0, "d")]:
        clock[0] = 100.0 + t
        say(step)
    say.done()
    lines = buf.getvalue().splitlines()
    assert [line.split(": ")[1].split(" (")[0] for line in lines[:-1]] == ["b", "d"]
    assert lines[-1].startswith("tpplan report m: done in")


def test_a_quick_run_prints_nothing(monkeypatch):
    buf = io.StringIO()
    say = PlainSteps(Console(file=buf), "tpplan search m")
    say("searching")
    say.done()
    assert buf.getvalue() == ""


def test_search_in_a_pipe_prints_its_steps_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(_console, "QUIET_S", 0.0)
    monkeypatch.setattr(_console, "EVERY_S", 0.0)
    code, out, err = run_cli(monkeypatch, capsys, "search", "--model", "tiny-qwen3", "--topology", "h200x8-ib400",
                             "--tp", "2", "--top", "2")  # fmt: skip
    assert code == 0
    lines = err.splitlines()
    assert any(line.startswith("tpplan search tiny-qwen3: searching") for line in lines), err
    assert lines[-1].startswith("tpplan search tiny-qwen3: done in")
    assert "searching" not in out  # stdout stays the result


def test_a_long_single_step_is_repeated_while_it_runs(monkeypatch):
    """One step that takes long (loading kernel tables) still shows in a log, from the ticking thread."""
    import time

    monkeypatch.setattr(_console, "QUIET_S", 0.0)
    monkeypatch.setattr(_console, "EVERY_S", 0.05)
    buf = io.StringIO()
    say = PlainSteps(Console(file=buf, width=100), "tpplan audit m", tick=0.01)
    say("loading the kernel tables")
    time.sleep(0.3)
    say.done()
    lines = buf.getvalue().splitlines()
    assert sum("loading the kernel tables" in line for line in lines) >= 3, lines
    n = len(buf.getvalue())
    time.sleep(0.1)
    assert len(buf.getvalue()) == n  # done() stopped the thread


def test_a_failed_run_stops_the_progress_thread(monkeypatch):
    import threading

    monkeypatch.setattr(_console, "QUIET_S", 0.0)
    try:
        with _console.steps("tpplan audit m") as say:
            say("auditing")
            raise ValueError("boom")
    except ValueError:
        pass
    for t in threading.enumerate():
        if t.name == "tpplan-steps":
            t.join(timeout=2)
            assert not t.is_alive()


def test_audit_in_a_pipe_prints_its_steps(monkeypatch, capsys):
    monkeypatch.setattr(_console, "QUIET_S", 0.0)
    monkeypatch.setattr(_console, "EVERY_S", 0.0)
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-qwen3", "--tp", "2", "--topology",
                           "h200x8-ib400", "--workload", "prompt16k-c8")  # fmt: skip
    assert code == 0
    assert "tpplan audit tiny-qwen3: pricing" in err and err.splitlines()[-1].startswith(
        "tpplan audit tiny-qwen3: done"
    )
