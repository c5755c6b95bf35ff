"""Model specs and graphs come from config.json files, and match the published shapes."""

import pytest

from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import OpKind, WeightSplit, build_model_graph


def _op(graph, kind, name):
    return next(o for o in graph.kinds[kind].ops if o.name == name)


def test_every_preset_builds_a_graph():
    assert {"kimi-k3", "deepseek-v3", "kimi-k2", "kimi-linear-48b", "qwen3-next-80b"} <= set(list_presets())
    tiny_families = {load_model(p).family for p in list_presets() if p.startswith("tiny-")}
    assert tiny_families >= {"deepseek_v3", "kimi_linear", "kimi_k3", "qwen3_next", "gqa"} | {
        "gpt_oss", "gemma3", "llama4"
    }
    for name in list_presets():
        graph = build_model_graph(load_model(name))
        assert sum(graph.counts().values()) == graph.spec.num_layers
        for lg in graph.kinds.values():
            produced = {"resid", "delta", "bank"}
            for op in lg.ops:  # every op reads values produced before it
                assert set(op.inputs) <= produced, (name, op.name)
                produced.add(op.output)
            assert "mlp_out" in produced


def test_kimi_k3_structure_matches_the_seed():
    spec = load_model("kimi-k3")
    kinds = [layer.attn.kind for layer in spec.layers]
    assert len(kinds) == 93 and kinds.count("kda") == 69 and kinds.count("mla") == 24
    assert kinds[91] == kinds[92] == "mla"  # 1-based layers 92 and 93
    assert spec.layers[0].mlp.kind == "dense" and all(layer.mlp.kind == "moe" for layer in spec.layers[1:])
    assert spec.attn_res_block_size == 12
    g = build_model_graph(spec)
    qkv_a = _op(g, "mla+moe", "qkv_a")
    assert qkv_a.weight_shape == (2112, 7168) and qkv_a.split is WeightSplit.REPLICATED
    g_proj = _op(g, "mla+moe", "g_proj")
    assert g_proj.weight_shape == (96 * 128, 7168) and g_proj.split is WeightSplit.COL
    kda_gate = _op(g, "kda+moe", "g_proj")  # full-rank KDA gate
    assert kda_gate.weight_shape == (12288, 7168)
    assert _op(g, "kda+moe", "q_conv1d").kind is OpKind.TOKEN_MIX
    experts = _op(g, "mla+moe", "experts")
    assert experts.attrs["width"] == 3584 and experts.attrs["experts"] == 896 and experts.attrs["top_k"] == 16
    assert _op(g, "mla+moe", "latent_down").weight_shape == (3584, 7168)
    assert _op(g, "mla+moe", "shared_gate_proj").weight_shape == (2 * 3072, 7168)
    assert _op(g, "kda+dense", "gate_proj").weight_shape == (33792, 7168)
    assert _op(g, "mla+moe", "attn_attn_res").kind is OpKind.ATTN_RES


def test_other_families():
    ds = build_model_graph(load_model("deepseek-v3"))
    assert ds.counts() == {"mla+dense": 3, "mla+moe": 58}
    assert _op(ds, "mla+moe", "q_b_proj").weight_shape == (128 * 192, 1536)
    k2 = load_model("kimi-k2")
    assert k2.layers[1].attn.heads == 64 and k2.layers[1].mlp.experts == 384
    kl = build_model_graph(load_model("kimi-linear-48b"))
    assert kl.counts() == {"kda+dense": 1, "kda+moe": 19, "mla+moe": 7}
    assert _op(kl, "mla+moe", "q_proj").weight_shape == (32 * 192, 2304)  # no q_lora
    assert _op(kl, "kda+moe", "q_proj").weight_shape == (4096, 2304)
    assert {o.name for o in kl.kinds["kda+moe"].ops} >= {"g_a_proj", "g_b_proj", "f_a_proj", "f_b_proj", "b_proj"}
    qn = build_model_graph(load_model("qwen3-next-80b"))
    assert qn.counts() == {"gdn+moe": 36, "gqa+moe": 12}
    assert _op(qn, "gqa+moe", "q_proj").weight_shape == (2 * 16 * 256, 2048)  # query + gate
    assert _op(qn, "gdn+moe", "in_proj_qkvz").weight_shape == (2 * 16 * 128 + 2 * 32 * 128, 2048)


@pytest.mark.parametrize("latent_key", ["routed_expert_hidden_size", "moe_latent_size"])
def test_k3_latent_field_aliases(latent_key, tmp_path):
    import json

    from tpplan.models.config import load_config_dict

    raw, _ = load_config_dict("tiny-kimi-k3")
    raw["text_config"].pop("routed_expert_hidden_size")
    raw["text_config"][latent_key] = 48
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert load_model(str(path)).layers[1].mlp.latent == 48


def test_every_op_kind_and_mixer_is_registered_once():
    """The op-kind registry covers every OpKind; every TOKEN_MIX op of every preset names a
    registered mixer whose cost class the cost model knows, and every attention kind has a builder."""
    from tpplan.models.opkinds import COST_CLASSES, OP_KINDS, cost_class, mixer

    assert set(OP_KINDS) == set(OpKind)
    for name in list_presets():
        graph = build_model_graph(load_model(name))
        for lg in graph.kinds.values():
            assert mixer(lg.spec.attn.kind).build is not None
            for op in lg.ops:
                assert cost_class(op) in COST_CLASSES, (name, op.name)
                if op.kind is OpKind.TOKEN_MIX:
                    assert mixer(str(op.attrs["impl"])).name == op.attrs["impl"]


def test_model_types_resolve_to_their_family_module():
    from tpplan.models.families import family_for, supported_model_types

    assert {"deepseek_v3", "kimi_k2", "kimi_linear", "kimi_k3", "qwen3_next", "llama", "qwen3", "qwen3_moe",
            "mistral"} <= set(supported_model_types())  # fmt: skip
    assert family_for("kimi_k2").name == "deepseek_v3" and family_for("mistral").name == "gqa"
    assert family_for("gpt9") is None
    for preset in ("tiny-deepseek-v3", "tiny-kimi-k3", "tiny-qwen3-next", "tiny-llama", "tiny-qwen3-moe"):
        spec = load_model(preset)
        assert family_for(spec.model_type).name == spec.family
