"""Outputs whole or absent (issue 20, items 1, 6, 8): a full disk or SIGTERM at any step of a write
leaves the previous state and no temporary; links, tpplan's own records, empty foreign files,
read-only folders and another command's folder are refused, never replaced."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from tpplan import outputs
from tpplan.errors import TpplanError
from tpplan.outputs import LEDGER, LOCK, MARKER, check_dir, check_file, write_dir, write_files

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ("search", "-m", "tiny-kimi-k3", "-t", "h200x2")
TINY_REPORT = ("report", "--model", "tiny-kimi-k3", "--topology", "h200x2", "--tp", "2", "--workload", "seed-c8")


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under root: a file's bytes, a link's target, or "<dir>"."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
    return out


def _one_line_error(code: int, err: str) -> str:
    assert code == 2 and "Traceback" not in err, err
    # progress lines ("tpplan search NAME: ...") appear off a terminal once a command runs a few seconds,
    # as on a loaded machine: they are not part of the error
    lines = [line for line in err.strip().splitlines() if not line.startswith("tpplan ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0], err
    return lines[0]


class _FaultyOs:
    """`os` as tpplan.outputs sees it, with `name` raising ENOSPC on its `at`-th call (0-based)."""

    def __init__(self, name: str, at: int) -> None:
        self.name, self.at, self.calls = name, at, 0

    def __getattr__(self, attr: str):
        real = getattr(os, attr)
        if attr != self.name:
            return real

        def faulty(*args, **kwargs):
            self.calls += 1
            if self.calls - 1 == self.at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        return faulty


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_full_disk_at_any_step_leaves_the_previous_state(tmp_path, monkeypatch, step):
    """Each call of `step` in turn fails with ENOSPC: before the output's rename the old file and its
    record stay (one line, exit 2); after it the new file is in place and recorded. Never a temporary,
    and the next run always replaces tpplan's own file."""
    out, other = tmp_path / "out.json", tmp_path / "other.json"
    write_files({out: "old\n", other: "kept\n"})
    failures = 0
    for at in range(20):
        faulty = _FaultyOs(step, at)
        monkeypatch.setattr(outputs, "os", faulty)
        try:
            write_files({out: "new\n"}, "--json")
            raised = None
        except TpplanError as exc:
            raised = str(exc)
        monkeypatch.setattr(outputs, "os", os)
        if faulty.calls <= at:  # every call of `step` has had its turn
            break
        assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER, LOCK, "other.json", "out.json"]  # no temporary
        if raised is not None:
            failures += 1
            assert "No space left on device" in raised and "nothing was written" in raised
            assert out.read_text() == "old\n"
        else:
            assert out.read_text() == "new\n"  # failed after the rename: only the ledger's tidying was lost
        assert check_file("--json", out) == out and check_file("--json", other) == other  # both still tpplan's
        write_files({out: "old\n"}, "--json")  # and the next run replaces it
    else:
        raise AssertionError(f"{step} called more than 20 times")
    assert failures >= 2  # at least the output's and the ledger's temporaries were hit


def test_search_json_on_a_full_disk_keeps_the_previous_file_and_the_next_run_replaces_it(tmp_path, monkeypatch, capsys):
    """The issue's case: `search --json` when the disk fills while the ledger is written."""
    out = tmp_path / "out.json"
    args = (*SEARCH, "--json", str(out))
    write_files({out: '{"an": "earlier run"}\n'})  # tpplan's own file, with other content than this run's
    before = _tree(tmp_path)
    monkeypatch.setattr(outputs, "os", _FaultyOs("write", 1))  # 0: the output's temporary, 1: the ledger's
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *args))
    monkeypatch.setattr(outputs, "os", os)
    assert "No space left on device" in line and "nothing was written" in line
    assert _tree(tmp_path) == before  # the previous file and ledger, no temporary
    assert run_in_process(monkeypatch, capsys, *args)[0] == 0  # tpplan's own file: replaced
    assert json.loads(out.read_text())["tp"] == 2


def test_a_ledger_mid_write_accepts_the_old_and_the_new_content(tmp_path, monkeypatch):
    """Stopped between the ledger's rename and the output's (the riskiest point), both contents are tpplan's."""
    out = tmp_path / "out.json"
    write_files({out: "old\n"})
    monkeypatch.setattr(outputs, "os", _FaultyOs("replace", 1))  # 0: the ledger, 1: the output
    with pytest.raises(TpplanError):
        write_files({out: "new\n"}, "--json")
    monkeypatch.setattr(outputs, "os", os)
    assert len(json.loads((tmp_path / LEDGER).read_text())["files"]["out.json"]) == 2
    check_file("--json", out)
    out.write_text("new\n")
    check_file("--json", out)  # as if the rename had gone through
    write_files({out: "newer\n"})
    assert isinstance(json.loads((tmp_path / LEDGER).read_text())["files"]["out.json"], str)  # compacted again


_SLOW_WRITE = """
import os, sys, time
from pathlib import Path
import tpplan.outputs as o

kind, target, name, nth = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
real, calls = getattr(os, name), []

def slow(*args, **kwargs):
    calls.append(1)
    if len(calls) == nth:
        print("writing", flush=True)
        time.sleep(60)
    return real(*args, **kwargs)

class SlowOs:
    def __getattr__(self, attr):
        return slow if attr == name else getattr(os, attr)

if kind == "file":
    o.write_files({target: "old\\n"})
    o.os = SlowOs()
    o.write_files({target: "new\\n"}, "--json")
else:
    o.write_dir(target, {"report.md": b"old"}, "--out")
    o.os = SlowOs()
    o.write_dir(target, {"report.md": b"new"}, "--out")
"""


def _hangup_as_a_terminal_leaves_it() -> None:
    """The child starts with SIGHUP at its default: under `nohup` (or any runner that ignores SIGHUP) the
    child would inherit the ignore, and tpplan rightly leaves an ignored signal ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize(
    ("kind", "slowed", "nth"),
    [("file", "chmod", 1), ("file", "replace", 2), ("dir", "chmod", 1), ("dir", "rename", 2)],
    ids=["file:temporary", "file:between-renames", "dir:temporary", "dir:old-moved-away"],
)
def test_sigterm_while_writing_cleans_up_like_sigint(tmp_path, kind, slowed, nth, sig):
    """SIGTERM, and SIGHUP too (issue 35: it left partial temporaries), at each step of a write."""
    target = tmp_path / ("out.json" if kind == "file" else "report")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITE, kind, str(target), slowed, str(nth)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_hangup_as_a_terminal_leaves_it,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n", proc.stderr.read()  # type: ignore[union-attr]
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 128 + sig
    finally:
        proc.kill()
        proc.wait()
    names = sorted(p.name for p in tmp_path.iterdir())
    if kind == "file":
        assert names == [LEDGER, LOCK, "out.json"]
        assert target.read_text() == "old\n"
        check_file("--json", target)
    else:
        assert names == ["report"]
        assert (target / "report.md").read_bytes() == b"old"
        check_dir("--out", target)


# --- output paths that are not tpplan's to replace ----------------------------------------------


def _search_file(tmp_path: Path, case: str) -> Path:
    if case == "symlink-to-own-file":
        (tmp_path / "real.json").write_text("x")
        (tmp_path / "link.json").symlink_to("real.json")
        return tmp_path / "link.json"
    if case == "dangling-symlink":
        (tmp_path / "link.json").symlink_to("nowhere.json")
        return tmp_path / "link.json"
    if case == "empty-foreign-file":
        (tmp_path / "empty.json").touch()
        return tmp_path / "empty.json"
    if case in ("ledger", "marker"):
        return tmp_path / (LEDGER if case == "ledger" else MARKER)
    raise AssertionError(case)


FILE_REASONS = {
    "symlink-to-own-file": "is a symbolic link",
    "dangling-symlink": "is a symbolic link",
    "empty-foreign-file": "tpplan did not write it",
    "ledger": "tpplan's own record",
    "marker": "tpplan's own record",
}


@pytest.mark.parametrize("case", list(FILE_REASONS))
def test_search_json_refuses_what_is_not_its_own(tmp_path, monkeypatch, capsys, case):
    out = _search_file(tmp_path, case)
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *SEARCH, "--json", str(out)))
    assert FILE_REASONS[case] in line and str(out) in line
    assert _tree(tmp_path) == before


def test_a_tpplan_file_behind_a_link_is_refused_too(tmp_path):
    """The policy is about the path: a link is never replaced, even to a file tpplan wrote."""
    write_files({tmp_path / "own.json": "x"})
    (tmp_path / "link.json").symlink_to("own.json")
    with pytest.raises(TpplanError, match="symbolic link"):
        check_file("--json", tmp_path / "link.json")


def test_report_out_refuses_a_link_to_a_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "L").symlink_to("real")
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(tmp_path / "L")))
    assert "is a symbolic link" in line
    assert _tree(tmp_path) == before  # the link is still a link, and no .L.old-* beside it


def test_report_out_refuses_a_read_only_empty_folder(tmp_path, monkeypatch, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(ro)))
        assert "read-only folder" in line
        assert _tree(tmp_path) == {"ro": "<dir>"} and not os.stat(ro).st_mode & 0o222
    finally:
        os.chmod(ro, 0o755)


@pytest.mark.parametrize("name", [LEDGER, MARKER])
def test_report_out_refuses_tpplan_s_own_record_names(tmp_path, name):
    with pytest.raises(TpplanError, match="tpplan's own record"):
        check_dir("--out", tmp_path / name)


def test_one_command_never_replaces_another_s_folder(tmp_path, monkeypatch, capsys):
    saved = tmp_path / "plans"
    assert run_in_process(monkeypatch, capsys, *SEARCH, "--save", str(saved))[0] == 0
    assert json.loads((saved / MARKER).read_text())["command"] == "search --save"
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(saved)))
    assert "was written by `tpplan search --save`, not `tpplan report`" in line
    assert _tree(tmp_path) == before  # every plan file still there

    report = write_dir(tmp_path / "memo", {"report.md": b"# memo\n"}, "--out")
    assert json.loads((report / MARKER).read_text())["command"] == "report"
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *SEARCH, "--save", str(report)))
    assert "was written by `tpplan report`, not `tpplan search --save`" in line
    assert _tree(tmp_path) == before
    assert run_in_process(monkeypatch, capsys, *SEARCH, "--save", str(saved))[0] == 0  # its own: replaced


def _legacy_folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A folder as an older tpplan wrote it: a MARKER with no command."""
    d = tmp_path / "old"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    listed = {n: outputs._sha256(b) for n, b in files.items()}
    (d / MARKER).write_text(json.dumps({"written_by": "tpplan", "files": listed}))
    return d


def test_an_older_marker_is_told_apart_by_what_the_folder_holds(tmp_path):
    saved = _legacy_folder(tmp_path, {"index.json": b"{}", "plan-1.json": b"{}"})
    assert check_dir("--save", saved) == saved
    with pytest.raises(TpplanError, match="written by `tpplan search --save`"):
        check_dir("--out", saved)
    (tmp_path / "r").mkdir()
    memo = _legacy_folder(tmp_path / "r", {"report.md": b"# memo\n"})
    assert check_dir("--out", memo) == memo
    with pytest.raises(TpplanError, match="written by `tpplan report`"):
        check_dir("--save", memo)


def test_sigterm_handler_is_only_borrowed(tmp_path):
    def mine(signum, frame):
        return None

    write_files({tmp_path / "a.json": "x"})
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back after the write
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        write_files({tmp_path / "a.json": "y"})
        assert signal.getsignal(signal.SIGTERM) is mine  # a handler someone else set is left alone
    finally:
        signal.signal(signal.SIGTERM, previous)
