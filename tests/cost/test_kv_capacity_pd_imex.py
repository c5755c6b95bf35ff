"""vLLM 0.34.0 P/D servers and the IMEX channel (issues 30/32): NixlConnector exports the KV cache through
NVLink fabric handles (NixlBaseConnector.kv_cache_access: REGISTERS | EXPORTS_FABRIC), and
VllmConfig._resolve_extensible_kv_cache leaves the extensible cache off where imex_channel_available() is False,
so gpu_memory_utilization resolves to 0.92 (CacheConfig.resolved_gpu_memory_utilization) and the cache is sized
the profiled way (Worker.determine_available_memory). The cluster file says whether its nodes have a channel
(`imex_channel`); not stated is taken as none. Expected values are worked here from those formulas."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.kv_capacity import kv_capacity
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.engines import kv_sizing
from tpplan.engines.doc import render
from tpplan.engines.schema import VllmMemory
from tpplan.engines.serving_flags import memory_flags
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline

GIB = 2**30
LONG = 1_000_000


def _predictor(topology: str, imex: bool | None = None, gpu: str | None = None):
    topo = select_topology(topology, 1, gpu=gpu)
    if imex is not None:
        topo = topo.model_copy(update={"imex_channel": imex})
    g = build_model_graph(load_model("tiny-llama"))
    return cached_predictor(g, baseline(), topo, Mesh(2), "bf16", None)


def test_the_rule_is_read_for_0_34_0_only() -> None:
    new, old = kv_sizing("vllm@0.34.0"), kv_sizing("vllm@0.33.0")
    assert isinstance(new, VllmMemory) and isinstance(old, VllmMemory)
    assert new.pd_fabric is not None and new.pd_fabric.connector == "NixlConnector"
    assert new.pd_fabric.facts[0].source.function == "VllmConfig._resolve_extensible_kv_cache"
    assert all(f.source.ref == "0.34.0 (PyPI wheel)" for f in new.pd_fabric.facts)
    assert new.pd_fabric.facts[0].text in render()  # docs/engines.md lists them
    assert old.for_server(True, False) is old  # 0.33.0 has no extensible cache to turn off


@pytest.mark.parametrize("imex", [None, False])
def test_a_pd_server_without_an_imex_channel_sizes_the_profiled_way(imex: bool | None) -> None:
    p = _predictor("h100x8-ib400", imex)
    agg = kv_capacity(p, "vllm@0.34.0", LONG)
    pd = kv_capacity(p, "vllm@0.34.0", LONG, pd=True)
    peak = pd.settings["activation_peak_bytes"]
    card = p.topo.gpu.memory_GiB * GIB
    # aggregated: extensible at 1.0 (headroom - max(1 GiB, 0.75 peak) - peak); P/D: ceil(total x 0.92) - weights - peak
    assert agg.pool_bytes == pytest.approx(card - agg.weights - max(GIB, 0.75 * peak) - peak)
    assert pd.pool_bytes == pytest.approx(card * 0.92 - pd.weights - peak)
    assert pd.pool_bytes < agg.pool_bytes
    assert (agg.settings["gpu_memory_utilization"], pd.settings["gpu_memory_utilization"]) == (1.0, 0.92)
    cell = pd.bytes_per_token
    assert pd.tokens == int(pd.pool_bytes // (64 * cell)) * 64
    assert pd.batch == min(int(pd.pool_bytes // (math.ceil(LONG / 64) * 64 * cell)), 1024)
    assert pd.facts[0] == kv_sizing("vllm@0.34.0").pd_fabric.facts[0].source.cite()  # type: ignore[union-attr]
    assert len(pd.facts) > len(agg.facts)  # the P/D rule's sources added
    said = "imex_channel = false" if imex is False else "imex_channel not stated, taken as none"
    assert "IMEX channel" in pd.reserve_text and said in pd.reserve_text and "IMEX" not in agg.reserve_text
    # the launch line follows the sizing
    assert memory_flags("vllm@0.34.0", pd.settings, 8192, None)[0] == "--gpu-memory-utilization 0.92"
    assert memory_flags("vllm@0.34.0", agg.settings, 8192, None)[0] == "--gpu-memory-utilization 1"


def test_a_pd_server_with_an_imex_channel_keeps_the_extensible_cache() -> None:
    """GB300 NVL72's cluster file states imex_channel = true: P/D servers size as aggregated ones."""
    p = _predictor("gb300-nvl72")
    assert p.topo.imex_channel is True
    agg = kv_capacity(p, "vllm@0.34.0", LONG)
    pd = kv_capacity(p, "vllm@0.34.0", LONG, pd=True)
    assert pd == agg and pd.settings["gpu_memory_utilization"] == 1.0
    # the same GPU in a cluster stated without one is sized the profiled way
    off = kv_capacity(_predictor("gb300-nvl72", False), "vllm@0.34.0", LONG, pd=True)
    assert off.settings["gpu_memory_utilization"] == 0.92 and off.pool_bytes < agg.pool_bytes


def test_sglang_is_unchanged_by_the_pd_flag() -> None:
    p = _predictor("h100x8-ib400")
    assert kv_capacity(p, "sglang@0.5.23", LONG, pd=True) == kv_capacity(p, "sglang@0.5.23", LONG)


def test_the_pd_loop_sizes_the_decode_pool_as_a_pd_server() -> None:
    """`simulate.disagg` gives the decode instances the P/D server's pool, not the aggregated one's."""
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, _pools
    from tpplan.simulate.serving import replica_kv

    topo = select_topology("h200x8-ib400", 1)
    g = build_model_graph(load_model("tiny-llama"))
    p = cached_predictor(g, baseline(), topo, Mesh(1), "bf16", None, pipeline=pipeline_model("vllm@0.34.0"))
    (_, pd_tokens), _ = replica_kv(p, pd=True)  # type: ignore[misc]
    (_, agg_tokens), _ = replica_kv(p)  # type: ignore[misc]
    assert pd_tokens < agg_tokens
    pools = _pools(DisaggDeployment(PoolSpec(p, 1), PoolSpec(p, 1)))
    assert pools.decode.config.kv_tokens == pd_tokens
