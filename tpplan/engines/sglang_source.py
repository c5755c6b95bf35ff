"""Where tpplan read SGLang: its repository, the current release (0.5.23, its PyPI wheel's sources),
the release's layer-communicator package, and the `Source` of one function there or at an older
commit. The SGLang modules (`sglang.py`, `sglang_sp_moe.py`) cite through these."""

from __future__ import annotations

from tpplan.engines.schema import Source

REPO = "sgl-project/sglang"
REL = "0.5.23 (PyPI wheel)"
LB = "python/sglang/srt/layers/layer_boundary"  # the layer communicator in 0.5.23 (earlier `layers/communicator/`)


def rel(path: str, function: str) -> Source:
    """`function` in `path` of the release."""
    return Source(REPO, path, function, REL)


def old(path: str, function: str, commit: str) -> Source:
    """`function` in `path` at an older main commit."""
    return Source(REPO, path, function, f"commit {commit[:8]}")
