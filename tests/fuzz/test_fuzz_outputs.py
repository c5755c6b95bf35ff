"""Fuzzing the output paths (issue 35): `search --json X --save Y` where X and Y are each one of the
things a folder may hold at that name (nothing, tpplan's own file or folder, a user's file or folder,
a link, tpplan's records, a path inside the other, a name over 255 bytes, a file where a folder
goes), and a user's `.tpplan-files` beside them or not. The contract (`fuzzing.check`) and more: a
refused run changes no byte of what was there, and a run that succeeds changes only its outputs and
tpplan's records beside them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fuzzing import FUZZ, SCALE, check
from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.outputs import LEDGER, LOCK, MARKER, write_dir, write_files

SEARCH = ["search", "-m", "tiny-kimi-k3", "-t", "h200x2", "--tp", "2", "--top", "2"]
KINDS = ["new", "tpplan-file", "tpplan-folder", "user-file", "user-folder", "empty-folder", "link", "dangling",
         "ledger", "marker", "lock", "long", "under-a-file", "missing-folder", "same-as-other",
         "inside-other"]  # fmt: skip


def _make(folder: Path, name: str, kind: str, other: str) -> str:
    """Put `kind` at `folder/name`; the path to pass."""
    p = folder / name
    if kind == "tpplan-file":
        write_files({p: "{}\n"})
    elif kind == "tpplan-folder":
        write_dir(p, {"index.json": b"{}"}, "--save")
    elif kind == "user-file":
        p.write_text("mine\n")
    elif kind == "user-folder":
        p.mkdir()
        (p / "notes.md").write_text("mine\n")
    elif kind == "empty-folder":
        p.mkdir()
    elif kind == "link":
        (folder / "target.txt").write_text("mine\n")
        p.symlink_to("target.txt")
    elif kind == "dangling":
        p.symlink_to("nowhere")
    elif kind in ("ledger", "marker", "lock"):
        return str(folder / {"ledger": LEDGER, "marker": MARKER, "lock": LOCK}[kind])
    elif kind == "long":
        return str(folder / ("y" * 300))
    elif kind == "under-a-file":
        (folder / "plain").write_text("mine\n")
        return str(folder / "plain" / name)
    elif kind == "missing-folder":
        return str(folder / "missing" / name)
    elif kind == "same-as-other":
        return str(folder / other)
    elif kind == "inside-other":
        return str(folder / other / name)
    return str(p)


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = Path(root) / n
            key = str(p.relative_to(folder))
            out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
    return out


@settings(FUZZ, max_examples=30 * SCALE)
@given(
    json_kind=st.sampled_from(KINDS),
    save_kind=st.none() | st.sampled_from(KINDS),
    foreign_ledger=st.booleans(),
)
def test_search_output_paths(json_kind, save_kind, foreign_ledger):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        js = _make(folder, "s.json", json_kind, "saved")
        args = [*SEARCH, "--json", js]
        if save_kind is not None:
            args += ["--save", _make(folder, "saved", save_kind, "s.json")]
        if foreign_ledger:  # a user's file where tpplan keeps its ledger (over tpplan's own, if any)
            (folder / LEDGER).write_text("a user's notes\n")
        before = _snapshot(folder)
        outs = {Path(js).name} if Path(js).parent == folder else set()
        if save_kind is not None and Path(args[-1]).parent == folder:
            outs.add(Path(args[-1]).name)
        code = check(args, folder, {n for n in before if "/" not in n}, outs, ["--json", "--save"])
        after = _snapshot(folder)
        if code == 2:
            assert {k: v for k, v in after.items() if k != LOCK} == {k: v for k, v in before.items() if k != LOCK}
        else:
            mine = {n for n in after if n.split("/")[0] in outs | {LEDGER, LOCK}}
            assert {k: v for k, v in after.items() if k not in mine} == {
                k: v for k, v in before.items() if k not in mine
            }
