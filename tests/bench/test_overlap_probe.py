"""The overlap probe's edges on a machine without a GPU: it refuses before any work."""

from __future__ import annotations

import pytest

from tpplan.bench import overlap_probe, overlap_replay


def test_refuses_a_file_tpplan_did_not_write(tmp_path, capsys):
    foreign = tmp_path / "mine.json"
    foreign.write_text("keep me")
    assert overlap_probe.main(["--out", str(foreign)]) == 2
    assert foreign.read_text() == "keep me"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0]


def test_without_cuda_exits_2_and_writes_nothing(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    out = tmp_path / "o.json"
    assert overlap_probe.main(["--out", str(out)]) == 2
    assert not out.exists()
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("tool", [overlap_probe, overlap_replay])
def test_both_gpu_tools_refuse_before_any_work_without_a_gpu(tool, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    foreign = tmp_path / "mine.json"
    foreign.write_text("keep me")
    assert tool.main(["--out", str(foreign)]) == 2 and foreign.read_text() == "keep me"
    if not torch.cuda.is_available():
        out = tmp_path / "o.json"
        assert tool.main(["--out", str(out)]) == 2 and not out.exists()
