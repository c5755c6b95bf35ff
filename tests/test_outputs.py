"""Nothing lost: output paths are checked before any work, and `--out` never replaces a folder tpplan
did not write. Each bad path is one line on stderr, exit 2, no traceback, and no file left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_in_process

from tpplan.outputs import LEDGER, LOCK, MARKER, check_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
TINY_REPORT = ("report", "--model", "tiny-kimi-k3", "--topology", "h200x2", "--tp", "2", "--workload", "seed-c8")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under root with its content (hidden files and .git included)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0], err
    return lines[0]


# --- report --out never deletes what tpplan did not write -------------------------------------


def _foreign_notes(tmp_path: Path) -> Path:
    d = tmp_path / "notes"
    d.mkdir()
    (d / "ideas.md").write_text("my notes\n")
    (d / "sub").mkdir()
    (d / "sub" / "data.csv").write_text("1,2\n")
    return d


def _git_repo(tmp_path: Path) -> Path:
    d = tmp_path / "repo"
    d.mkdir()
    subprocess.run(["git", "init", "-q", str(d)], check=True)
    (d / "README.md").write_text("a repository\n")
    return d


@pytest.mark.parametrize("make", [_foreign_notes, _git_repo], ids=["folder-with-notes", "git-repository"])
def test_report_out_refuses_a_folder_it_did_not_write(tmp_path, monkeypatch, capsys, make):
    target = make(tmp_path)
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(target)))
    assert "tpplan did not write it" in line and str(target) in line
    assert _tree(tmp_path) == before  # untouched, and no temporary folder beside it


def test_report_default_out_refuses_an_existing_report_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "draft.txt").write_text("someone's own report\n")
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT))  # default --out report
    assert "--out report" in line and "draft.txt" in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("out", [".", ".."])
def test_report_out_is_never_the_current_folder(tmp_path, monkeypatch, capsys, out):
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", out))
    assert "is the current folder or holds it" in line and _tree(tmp_path) == {}


def test_report_out_replaces_only_its_own_unchanged_output(tmp_path, monkeypatch, capsys):
    out = tmp_path / "memo"
    out.mkdir()  # an empty folder is fine: nothing in it to lose
    code, err = run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(out))
    assert code == 0, err
    listed = json.loads((out / MARKER).read_text())["files"]
    assert set(listed) == {p.name for p in out.iterdir()} - {MARKER} and "report.md" in listed
    code, err = run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(out))
    assert code == 0, err  # its own earlier output: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memo"]

    (out / "my-notes.txt").write_text("added by hand\n")
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(out)))
    assert "holds my-notes.txt, which tpplan did not write" in line and _tree(tmp_path) == before

    (out / "my-notes.txt").unlink()
    (out / "report.md").write_text((out / "report.md").read_text() + "\nmy edit\n")
    before = _tree(tmp_path)
    line = _one_line_error(*run_in_process(monkeypatch, capsys, *TINY_REPORT, "--out", str(out)))
    assert "report.md was changed after tpplan wrote it" in line and _tree(tmp_path) == before


@pytest.mark.parametrize("example", sorted(p for p in EXAMPLES.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_checked_in_examples_can_be_regenerated_by_their_commands(example):
    """Each docs/examples/<name>/ carries the marker of exactly its files, so its documented command
    may replace it. After changing an example by hand or on another branch, run
    `rm -r docs/examples/<name>` and its command in docs/examples/README.md."""
    assert check_dir("--out", example) == example


# --- every output path of every command: checked before any work ---------------------------


def _bad_path(tmp_path: Path, case: str, kind: str) -> Path:
    """A path for an output of `kind` ("file" or "dir") that must be refused, and why."""
    if case == "is-a-directory":
        (tmp_path / "taken").mkdir()
        (tmp_path / "taken" / "keep.txt").write_text("x")
        return tmp_path / "taken"
    if case == "is-a-file":
        (tmp_path / "taken").write_text("x")
        return tmp_path / "taken"
    if case == "parent-is-a-file":
        (tmp_path / "afile").write_text("x")
        return tmp_path / "afile" / ("out" if kind == "dir" else "out.json")
    if case == "parent-missing":
        return tmp_path / "missing" / ("out" if kind == "dir" else "out.json")
    if case == "unwritable-folder":
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o555)
        return tmp_path / "ro" / ("out" if kind == "dir" else "out.json")
    if case == "read-only-file":
        (tmp_path / "ro.json").write_text("{}")
        os.chmod(tmp_path / "ro.json", 0o444)
        return tmp_path / "ro.json"
    raise AssertionError(case)


REASONS = {
    "is-a-directory": "is a folder, not a file",
    "is-a-file": "is a file, not a directory",
    "parent-is-a-file": "is a file, not a folder",
    "parent-missing": "does not exist",
    "unwritable-folder": "cannot create files in folder",
    "read-only-file": "is read-only",
}
BENCH = "docs/benchmarks/h200x2-2026-11-30-kernel-profiles/k3-baseline.json"
KERNEL_FIT = "docs/benchmarks/h200-2026-12-01/kernel-models-fit.json"
COMMANDS = {  # command line with {out} where the output path goes, and the output's kind
    "search --json": (["search", "-m", "tiny-kimi-k3", "--tp", "2", "--json", "{out}"], "file"),
    "report --out": ([*TINY_REPORT, "--out", "{out}"], "dir"),
    "verify --json": (["verify", "-m", "tiny-llama", "--tp", "2", "-p", "baseline", "--json", "{out}"], "file"),
    "bench --out": (["bench", "-m", "tiny-kimi-k3", "-p", "baseline", "--out", "{out}"], "file"),
    "bench --md": (["bench", "--from", BENCH, "--md", "{out}"], "file"),
    "calibrate --out": (["calibrate", "--nproc", "2", "--out", "{out}"], "file"),
    "calibrate --kernels-from": (["calibrate", "--kernels-from", BENCH, "--out", "{out}"], "file"),
    "bench --repredict --out": (["bench", "--from", BENCH, "--repredict", "--out", "{out}"], "file"),
    "calibrate --kernel-models": (["calibrate", "--kernel-models", KERNEL_FIT, "--out", "{out}"], "file"),
}
CASES = [
    (cmd, case)
    for cmd, (_, kind) in COMMANDS.items()
    for case in REASONS
    if not (kind == "dir" and case in ("is-a-directory", "read-only-file"))
    and not (kind == "file" and case == "is-a-file")
]


@pytest.mark.parametrize(("command", "case"), CASES, ids=[f"{c}:{k}" for c, k in CASES])
def test_bad_output_path_is_one_line_exit_2_and_leaves_nothing(tmp_path, monkeypatch, capsys, command, case):
    args, kind = COMMANDS[command]
    out = _bad_path(tmp_path, case, kind)
    before = _tree(tmp_path)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # BENCH is relative to the repository
    try:
        line = _one_line_error(*run_in_process(monkeypatch, capsys, *(a.replace("{out}", str(out)) for a in args)))
    finally:
        for p in tmp_path.rglob("*"):  # let pytest clean up
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    assert REASONS[case] in line and str(out) in line
    assert _tree(tmp_path) == before


def test_search_json_is_written_whole(tmp_path, monkeypatch, capsys):
    out = tmp_path / "search.json"
    args = ("search", "-m", "tiny-kimi-k3", "-t", "h200x2", "--json", str(out))
    for _ in range(2):  # the second run replaces the file the first one wrote
        code, err = run_in_process(monkeypatch, capsys, *args)
        assert code == 0, err
        assert json.loads(out.read_text())["tp"] == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER, LOCK, "search.json"]  # no temporaries


@pytest.mark.parametrize("how", ["user-file", "edited"])
def test_a_file_tpplan_did_not_write_is_never_replaced(tmp_path, monkeypatch, capsys, how):
    """An existing file at an output path is replaced only when tpplan wrote it and it is unchanged
    (the folder's ledger says so); a user's file, or tpplan's file edited since, is refused, untouched."""
    out = tmp_path / "search.json"
    args = ("search", "-m", "tiny-kimi-k3", "-t", "h200x2", "--json", str(out))
    if how == "edited":
        assert run_in_process(monkeypatch, capsys, *args)[0] == 0
    out.write_text("my notes")
    code, err = run_in_process(monkeypatch, capsys, *args)
    assert code == 2 and "tpplan did not write it" in err and "Traceback" not in err
    assert out.read_text() == "my notes"


# --- errors found in worker processes -------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpplan", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.slow
def test_input_error_in_a_worker_exits_2(tmp_path):
    """An empty --weights folder is found bad by the ranks (they open the checkpoint): still exit 2."""
    (tmp_path / "weights").mkdir()
    r = _cli("verify", "-m", "tiny-llama", "--tp", "2", "-p", "baseline", "--tokens", "8", "--no-progress",
             "--weights", str(tmp_path / "weights"))  # fmt: skip
    line = _one_line_error(r.returncode, r.stderr)
    assert "no *.safetensors files found" in line


@pytest.mark.slow
def test_rank_killed_by_the_os_is_reported_as_out_of_memory():
    from fault_injection import fault_env

    r = _cli("verify", "-m", "tiny-llama", "--tp", "2", "-p", "sequence-parallel", "--tokens", "8", "--no-progress",
             env=fault_env("1:all_gather:kill"))  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "rank 1 was killed by the operating system (SIGKILL)" in lines[0] and "out of memory" in lines[0]
    assert "every rank holds the whole model" in lines[0] and "Try a smaller --tp" in lines[0]
