"""Outputs are never lost or forged (issue 35): a command's outputs are checked together before any
work, a file named like tpplan's ledger that tpplan did not write is never replaced, two runs writing
into one folder keep both ledger entries (the ledger is changed under a lock), a signal at the
instant a temporary is created leaves no temporary, a second Ctrl-C prints no traceback, and a path
the OS cannot look at (a name over 255 bytes) is one line, exit 2."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from tpplan import outputs
from tpplan.errors import TpplanError
from tpplan.outputs import LEDGER, LOCK, Output, check_file, check_outputs, write_dir, write_files
from tpplan.signals import STOPPING, Terminated

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ("search", "-m", "tiny-kimi-k3", "-t", "h200x2")


def _one_line(code: int, err: str) -> str:
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0], err
    return lines[0]


# --- a file named like the ledger that tpplan did not write ---------------------------------------


@pytest.mark.parametrize("foreign", ["text", "json", "folder", "link"])
def test_a_foreign_ledger_name_is_refused_and_kept(tmp_path, monkeypatch, capsys, foreign):
    ledger = tmp_path / LEDGER
    if foreign == "text":
        ledger.write_text("my notes\n")
    elif foreign == "json":
        ledger.write_text(json.dumps({"files": {"out.json": "0" * 64}}))  # no written_by: not tpplan's
    elif foreign == "folder":
        ledger.mkdir()
    else:
        (tmp_path / "elsewhere").write_text("x")
        ledger.symlink_to("elsewhere")
    before = {p.name: p.read_bytes() if p.is_file() and not p.is_symlink() else None for p in tmp_path.iterdir()}
    out = tmp_path / "out.json"
    line = _one_line(*run_in_process(monkeypatch, capsys, *SEARCH, "--json", str(out)))
    assert str(ledger) in line and "tpplan did not write it" in line
    after = {p.name: p.read_bytes() if p.is_file() and not p.is_symlink() else None for p in tmp_path.iterdir()}
    assert after == before  # untouched, and no output
    with pytest.raises(TpplanError, match="not the record tpplan keeps there"):
        write_files({out: "x"})  # a library caller without an option is held to it too


def test_a_foreign_ledger_that_appears_during_the_work_is_refused_at_write_time(tmp_path):
    out = tmp_path / "out.json"
    check_file("--json", out)
    (tmp_path / LEDGER).write_text("appeared meanwhile\n")
    with pytest.raises(TpplanError, match="not the record tpplan keeps there"):
        write_files({out: "x"}, "--json")
    assert (tmp_path / LEDGER).read_text() == "appeared meanwhile\n" and not out.exists()


# --- all outputs of one command, together --------------------------------------------------------


@pytest.mark.parametrize("exists", [True, False])
def test_search_json_inside_the_save_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys, exists):
    """The JSON used to be written first, then the folder refused for holding it: s.json was left."""
    save, js = tmp_path / "out", tmp_path / "out" / "s.json"
    if exists:
        save.mkdir()
    line = _one_line(*run_in_process(monkeypatch, capsys, *SEARCH, "--save", str(save), "--json", str(js)))
    assert f"--json {js}" in line and f"inside --save {save}" in line
    assert [p.name for p in tmp_path.rglob("*")] == (["out"] if exists else [])


def test_search_json_and_save_on_one_path_is_refused(tmp_path, monkeypatch, capsys):
    both = tmp_path / "x"
    line = _one_line(*run_in_process(monkeypatch, capsys, *SEARCH, "--save", str(both), "--json", str(both)))
    assert "the same path" in line
    assert list(tmp_path.iterdir()) == []


def test_bench_out_and_md_on_one_file_is_refused_before_running(tmp_path, monkeypatch, capsys):
    """`bench --out o.json --md o.json` wrote the JSON and then replaced it with the markdown."""
    o = tmp_path / "o.json"
    args = ("bench", "--model", "tiny-llama", "--plan", "baseline", "--out", str(o), "--md", str(o))
    line = _one_line(*run_in_process(monkeypatch, capsys, *args))
    assert f"--md {o}" in line and f"the same path as --out {o}" in line
    assert list(tmp_path.iterdir()) == []


def test_check_outputs_sees_one_path_under_two_spellings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(TpplanError, match="the same path as --out"):
        check_outputs(Output("--out", "sub/a.json"), Output("--md", str(tmp_path / "sub" / ".." / "sub" / "a.json")))
    with pytest.raises(TpplanError, match=r"--out b/c: is inside --save b"):
        check_outputs(Output("--save", "b", folder=True), Output("--out", "b/c", folder=True))
    assert check_outputs(Output("--out", "a.json"), Output("--md", "a.md")) == [Path("a.json"), Path("a.md")]


# --- two runs writing into one folder -----------------------------------------------------------


def _write_later(folder: str, name: str, done: mp.Queue) -> None:
    write_files({Path(folder) / name: f"{name}\n"}, "--json")
    done.put(name)


def _waits_on_a_lock(pid: int | None) -> bool:
    """The kernel says `pid` sleeps in a file lock wait (False where /proc does not say)."""
    try:
        return "lock" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def test_a_second_writer_waits_for_the_ledger_lock(tmp_path):
    """The lost update, made deterministic: while one run holds the lock and records its file, a
    second run's write waits; both files end up recorded (without the lock the second run's ledger,
    read before the first one's rename, dropped the first entry)."""
    ctx = mp.get_context("spawn")  # a forked child would share this process's lock (one open file description)
    done = ctx.Queue()
    with outputs._locked("--json", tmp_path / "a.json"):
        child = ctx.Process(target=_write_later, args=(str(tmp_path), "b.json", done))
        child.start()
        end = time.monotonic() + 10  # until the kernel shows it waiting on the lock (where /proc says so)
        while not _waits_on_a_lock(child.pid) and time.monotonic() < end and child.is_alive():
            time.sleep(0.05)
        assert done.empty() and not (tmp_path / "b.json").exists()  # waiting for the lock
        outputs._write_recorded({tmp_path / "a.json": b"a.json\n"})
    child.join(30)
    assert child.exitcode == 0 and done.get(timeout=5) == "b.json"
    assert set(json.loads((tmp_path / LEDGER).read_text())["files"]) == {"a.json", "b.json"}
    check_file("--json", tmp_path / "a.json")
    check_file("--json", tmp_path / "b.json")


def _many_writes(folder: str, prefix: str, n: int) -> None:
    for i in range(n):
        write_files({Path(folder) / f"{prefix}{i}.json": f"{prefix}{i}\n"}, "--json")


@pytest.mark.slow
def test_two_concurrent_writers_keep_every_ledger_entry(tmp_path):
    ctx = mp.get_context("spawn")  # two fresh interpreters, as two tpplan runs are
    writers = [ctx.Process(target=_many_writes, args=(str(tmp_path), p, 30)) for p in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
        assert w.exitcode == 0
    listed = set(json.loads((tmp_path / LEDGER).read_text())["files"])
    assert listed == {f"{p}{i}.json" for p in "ab" for i in range(30)}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [LEDGER, LOCK]


# --- a signal at the instant a temporary is created ----------------------------------------------


def _signal_after(real, prefix: str):
    """`real` (mkstemp or mkdtemp), then a SIGTERM to this process when the temporary's name starts
    with `prefix`: it lands right after the temporary exists, before the caller has its name."""

    def make(*args, **kwargs):
        got = real(*args, **kwargs)
        name = os.path.basename(got[1] if isinstance(got, tuple) else got)
        if name.startswith(prefix):
            os.kill(os.getpid(), signal.SIGTERM)
        return got

    return make


@pytest.mark.parametrize(
    ("kind", "prefix"),
    [("file", ".tpplan-probe-"), ("file", ".out.json."), ("file", LEDGER + "."), ("dir", ".report.tmp-"),
     ("dir", ".report.old-")],
)  # fmt: skip
def test_a_signal_as_a_temporary_is_created_leaves_no_temporary(tmp_path, monkeypatch, handlers, kind, prefix):
    """Each temporary a write makes (the folder probe, the output's, the ledger's; the new folder, the
    old folder's name): a SIGTERM the instant it exists leaves nothing but what was there before."""
    target = tmp_path / ("out.json" if kind == "file" else "report")
    if prefix == ".report.old-":
        write_dir(target, {"report.md": b"old"}, "--out")  # an earlier output to move aside
    before = sorted(p.name for p in tmp_path.iterdir())
    fake = types.ModuleType("fake_tempfile")  # outputs.tempfile, signalling
    fake.mkstemp = _signal_after(tempfile.mkstemp, prefix)  # type: ignore[attr-defined]
    fake.mkdtemp = _signal_after(tempfile.mkdtemp, prefix)  # type: ignore[attr-defined]
    monkeypatch.setattr(outputs, "tempfile", fake)
    with pytest.raises(Terminated):
        if kind == "file":
            write_files({target: "x"}, "--json")
        else:
            write_dir(target, {"report.md": b"new"}, "--out")
    monkeypatch.setattr(outputs, "tempfile", tempfile)
    assert set(p.name for p in tmp_path.iterdir()) - {LOCK} == set(before)
    if prefix == ".report.old-":
        assert (target / "report.md").read_bytes() == b"old"


# --- a second Ctrl-C while writing --------------------------------------------------------------

_SLOW_CLI = """
import os, sys, time
import tpplan.outputs as o
from tpplan.cli import main

real, calls = os.chmod, []

def slow(*args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
        print("writing", flush=True)
        time.sleep(60)
    return real(*args, **kwargs)

class SlowOs:
    def __getattr__(self, attr):
        return slow if attr == "chmod" else getattr(os, attr)

o.os = SlowOs()
sys.argv = ["tpplan", *sys.argv[1:]]
main()
"""


def _default_signals() -> None:
    """In the child: a background job of a non-interactive shell starts with SIGINT ignored."""
    for s in STOPPING:
        signal.signal(s, signal.SIG_DFL)


def test_a_second_ctrl_c_while_writing_prints_no_traceback_and_leaves_nothing(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_CLI, *SEARCH, "--json", str(out)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_default_signals,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n", proc.stderr.read()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # no output, no temporary


# --- paths the OS cannot look at -----------------------------------------------------------------


@pytest.mark.parametrize("option", ["--json", "--save"])
def test_an_output_name_over_255_bytes_is_one_line(tmp_path, monkeypatch, capsys, option):
    long = tmp_path / ("x" * 300)
    line = _one_line(*run_in_process(monkeypatch, capsys, *SEARCH, option, str(long)))
    assert line.startswith(f"error: {option} {tmp_path}") and "shorter path" in line
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TpplanError, match="shorter path"):
        check_outputs(Output("--md", tmp_path / "ok.md"), Output(option, long, folder=option == "--save"))
