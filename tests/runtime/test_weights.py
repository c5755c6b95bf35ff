"""Weights: safetensors round trip through alias names, and clear errors for bad checkpoints."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from tpplan.errors import TpplanError
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.runtime.executor import numerics_for, run_reference
from tpplan.runtime.weights import load_safetensors, random_weights


def _aliased(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Re-spell a canonical dict the way Kimi-Linear's release does (w1/w2/w3, block_sparse_moe)."""
    out = {}
    for k, v in w.items():
        k = k.replace(".mlp.experts.", ".block_sparse_moe.experts.")
        k = k.replace(".gate_proj.weight", ".w1.weight") if ".experts." in k else k
        k = k.replace(".up_proj.weight", ".w3.weight") if ".experts." in k else k
        k = k.replace(".down_proj.weight", ".w2.weight") if ".experts." in k else k
        out[k] = v.contiguous()
    return out


def test_safetensors_round_trip(tmp_path) -> None:
    graph = build_model_graph(load_model("tiny-kimi-linear"))
    nu = numerics_for(graph)
    w = random_weights(graph, nu, seed=3)
    ali = _aliased(w)
    names = sorted(ali)
    save_file({k: ali[k] for k in names[::2]}, str(tmp_path / "a.safetensors"))
    save_file({k: ali[k] for k in names[1::2]}, str(tmp_path / "b.safetensors"))
    loaded = load_safetensors(tmp_path, graph, nu)
    assert set(loaded) == set(w)
    ids = torch.arange(7)
    assert torch.equal(run_reference(graph, loaded, ids), run_reference(graph, w, ids))


def test_missing_and_misshapen_tensors_are_named(tmp_path) -> None:
    graph = build_model_graph(load_model("tiny-llama"))
    nu = numerics_for(graph)
    w = random_weights(graph, nu)
    bad = dict(w)
    del bad["model.layers.1.self_attn.k_proj.weight"]
    save_file(bad, str(tmp_path / "m.safetensors"))
    with pytest.raises(TpplanError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight.*missing"):
        load_safetensors(tmp_path, graph, nu)
    bad = dict(w)
    bad["model.norm.weight"] = torch.ones(63)
    save_file(bad, str(tmp_path / "m.safetensors"))
    with pytest.raises(TpplanError, match=r"model\.norm\.weight' has shape \[63\], expected \[64\]"):
        load_safetensors(tmp_path, graph, nu)
