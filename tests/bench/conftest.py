"""Fixtures for the bench tests that run a rank in the test process."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank gloo group in this process, so `bench.worker.worker` runs without spawning."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a process group is already formed in this process")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
