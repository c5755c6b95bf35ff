"""Malformed `*.safetensors` files under `--weights` (issue 35): each is refused in one line naming the
file and the fix, exit 2, before any rank starts; a FIFO no longer blocks `verify` past `--timeout`."""

from __future__ import annotations

import json
import os
import pickle
import struct
import time
from pathlib import Path

import pytest
from cli_helpers import run_captured as run

from tpplan.cli import as_flags
from tpplan.errors import TpplanError
from tpplan.runtime.checkpoint_files import check_file

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _header(entries: dict, data: bytes = b"") -> bytes:
    head = json.dumps(entries).encode()
    return struct.pack("<Q", len(head)) + head + data


def _make(kind: str, path: Path) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge header length":
        path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    elif kind == "offsets past the end":
        path.write_bytes(_header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8))
    elif kind == "a pickle renamed":
        path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    elif kind == "a torch.save zip renamed":
        torch.save({"w": torch.ones(2)}, path)
    elif kind == "a header that is not JSON":
        path.write_bytes(struct.pack("<Q", 4) + b"nope")
    elif kind == "a folder":
        path.mkdir()
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "a dangling link":
        path.symlink_to(path.parent / "gone")
    elif kind == "a FIFO":
        os.mkfifo(path)


KINDS = {
    "empty": "too short for a safetensors file",
    "huge header length": "header length 4,611,686,018,427,387,904 runs past",
    "offsets past the end": "outside the file's 8 data bytes",
    "a pickle renamed": "runs past",
    "a torch.save zip renamed": "runs past",
    "a header that is not JSON": "header is not a JSON object",
    "a folder": "is a folder, not a file",
    "/dev/zero": "is not a regular file",
    "a dangling link": "dangling",
    "a FIFO": "is not a regular file",
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_malformed_checkpoint_file_is_named_with_the_fix(tmp_path, kind):
    if kind == "a FIFO" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "model.safetensors"
    _make(kind, path)
    with pytest.raises(TpplanError) as err:
        check_file(path)
    shown = str(as_flags(err.value))  # as the CLI prints it: the field as its option
    assert shown.startswith(f"--weights {path}: ") and KINDS[kind] in shown, shown
    assert "Fix: point --weights at a folder of real *.safetensors files" in shown


def test_a_real_checkpoint_file_passes(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"w": torch.ones(3, 2)}, str(path))
    check_file(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_verify_with_a_fifo_checkpoint_exits_2_at_once(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    os.mkfifo(weights / "model.safetensors")
    t0 = time.monotonic()
    code, out, err = run("verify", "--model", "tiny-llama", "--tp", "2", "--plan", "baseline", "--tokens", "8",
                         "--no-progress", "--timeout", "5", "--weights", str(weights))  # fmt: skip
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--weights {weights / 'model.safetensors'}: is not a regular file" in " ".join(err.split())
    assert time.monotonic() - t0 < 30
