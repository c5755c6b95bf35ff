"""Model specs and graphs come from config.json files, and match the published shapes."""

import pytest

from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import OpKind, WeightSplit, build_model_graph


def _op(graph, kind, name):
    return next(o for o in graph.kinds[kind].ops if o.name == name)


def test_every_preset_builds_a_graph():
    assert {"kimi-k3", "deepseek-v3", "kimi-k2", "kimi-linear-48b", "qwen3-next-80b"} <= set(list_presets())
    tiny_families = {load_model(p).family for p in list_presets() if p.startswith("tiny-")}
    from tpplan.models.families import families

    assert tiny_families == set(families())  # every registered family has a tiny preset for the runtime tests
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


def test_the_split_a_weight_takes_under_a_plan_is_the_kinds():
    """Routed experts follow the plan's MoE mode whatever `replicate` says; a linear or the router is
    replicated where the plan replicates it and keeps its own split otherwise; a norm's weight never is."""
    from tpplan.models.opkinds import op_kind, weight_split

    lg = build_model_graph(load_model("tiny-deepseek-v3")).kinds["mla+moe"]
    by_kind = {op.kind: op for op in lg.ops}
    experts, router, norm = by_kind[OpKind.EXPERTS], by_kind[OpKind.ROUTER], by_kind[OpKind.NORM]
    col = next(op for op in lg.ops if op.kind is OpKind.LINEAR and op.split is WeightSplit.COL)
    assert [weight_split(experts, "a2a", r) for r in (False, True)] == ["a2a", "a2a"]
    assert [weight_split(col, "tp", r) for r in (False, True)] == [WeightSplit.COL, WeightSplit.REPLICATED]
    assert weight_split(router, "tp", True) == WeightSplit.REPLICATED
    assert weight_split(norm, "tp", True) == norm.split
    assert op_kind(router.kind).output_dtype(router, "bfloat16") == "float32"
    assert op_kind(col.kind).output_dtype(col, "bfloat16") == "bfloat16"


def test_model_types_resolve_to_their_family_module():
    from tpplan.models.families import family_for, supported_model_types

    assert {"deepseek_v3", "kimi_k2", "kimi_linear", "kimi_k3", "qwen3_next", "llama", "qwen3", "qwen3_moe",
            "mistral"} <= set(supported_model_types())  # fmt: skip
    assert family_for("kimi_k2").name == "deepseek_v3" and family_for("mistral").name == "gqa"
    assert family_for("gpt9") is None
    for preset in ("tiny-deepseek-v3", "tiny-kimi-k3", "tiny-qwen3-next", "tiny-llama", "tiny-kimi-k25"):
        spec = load_model(preset)
        assert family_for(spec.model_type).name == spec.family


def _moe_of(spec):
    return [layer.mlp for layer in spec.layers if layer.mlp.kind == "moe"]


@pytest.mark.parametrize(
    ("preset", "drop", "spelling"),
    [
        ("tiny-llama", (), {"num_local_experts": 4, "num_experts_per_tok": 2}),  # Mixtral's spelling
        ("tiny-llama", (), {"num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 40}),
        ("tiny-deepseek-v3", ("n_routed_experts", "num_experts_per_tok"),
         {"num_experts": 8, "num_experts_per_token": 2}),
        ("tiny-kimi-linear", ("num_experts", "num_experts_per_token", "num_shared_experts"),
         {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1}),
        ("tiny-qwen3-next", ("num_experts",), {"num_local_experts": 8}),
    ],
)  # fmt: skip
def test_every_moe_spelling_is_read(preset, drop, spelling):
    from tpplan.models.config import load_config_dict, spec_from_config

    raw = {k: v for k, v in load_config_dict(preset)[0].items() if k not in drop}
    moe = _moe_of(spec_from_config({**raw, **spelling}))
    assert moe, "a config that names experts was planned as dense"
    count = next(v for k, v in spelling.items() if k in ("num_experts", "num_local_experts", "n_routed_experts"))
    assert moe[0].experts == count
    top_k = next((v for k, v in spelling.items() if k.startswith("num_experts_per")), None)
    if top_k:
        assert moe[0].top_k == top_k
    if "num_local_experts" in spelling and preset == "tiny-llama":
        assert moe[0].expert_intermediate == raw["intermediate_size"]  # Mixtral: experts are intermediate_size wide


def test_a_config_naming_experts_is_never_planned_dense():
    from tpplan.errors import TpplanError
    from tpplan.models.config import load_config_dict, spec_from_config

    raw = load_config_dict("tiny-qwen3-moe")[0]
    with pytest.raises(TpplanError, match=r"names \d+ routed experts but no layer"):
        spec_from_config({**raw, "decoder_sparse_step": raw["num_hidden_layers"] + 1})


@pytest.mark.parametrize(
    ("model_type", "fields", "family"),
    [
        ("gemma2", {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                    "num_key_value_heads": 8, "head_dim": 256}, "gemma3"),
        ("deepseek_v4", {"kv_lora_rank": 512, "q_lora_rank": 1536, "index_n_heads": 64, "index_topk": 2048},
         "deepseek_v32"),
        ("my_gdn_hybrid", {"linear_num_key_heads": 16, "linear_key_head_dim": 128, "full_attention_interval": 4},
         "qwen3_next"),
    ],
)  # fmt: skip
def test_unknown_model_type_names_the_closest_family(model_type, fields, family):
    from tpplan.errors import TpplanError
    from tpplan.models.config import spec_from_config

    with pytest.raises(TpplanError) as err:
        spec_from_config({"model_type": model_type, "hidden_size": 64, **fields}, label="config.json")
    msg = str(err.value)
    assert f"unknown model_type '{model_type}'" in msg and f"closest supported family is {family} " in msg
    assert "docs/adding-a-family.md" in msg and "\n" not in msg


def test_mixtral_preset_matches_the_published_shapes():
    spec = load_model("mixtral-8x7b")
    assert spec.family == "gqa" and spec.num_layers == 32
    moe = _moe_of(spec)
    assert len(moe) == 32 and moe[0].experts == 8 and moe[0].top_k == 2 and moe[0].expert_intermediate == 14336
    g = build_model_graph(spec)
    assert _op(g, "gqa+moe", "k_proj").weight_shape == (8 * 128, 4096)
    assert _op(g, "gqa+moe", "experts").weight_shape == (8, 3, 4096, 14336)


def test_kimi_k25_reads_its_kimi_k2_text_config():
    spec = load_model("kimi-k25")
    assert spec.model_type == "kimi_k25" and spec.family == "kimi_k25" and spec.num_layers == 61
    moe = _moe_of(spec)
    assert len(moe) == 60 and moe[0].experts == 384 and moe[0].top_k == 8
    assert spec.layers[0].attn.heads == 64 and spec.quant is not None and spec.quant.fmt.name == "int4"


def test_deepseek_v2_lite_has_no_q_lora_and_softmax_greedy_routing():
    spec = load_model("deepseek-v2-lite")
    assert spec.family == "deepseek_v2" and spec.num_layers == 27
    g = build_model_graph(spec)
    names = {o.name for o in g.kinds["mla+moe"].ops}
    assert "qkv_a" not in names and _op(g, "mla+moe", "q_proj").weight_shape == (16 * 192, 2048)
    assert _op(g, "mla+moe", "kv_a").weight_shape == (512 + 64, 2048)
    router = _op(g, "mla+moe", "router")
    assert router.attrs["scoring"] == "softmax" and router.attrs["n_group"] == 1
    moe = _moe_of(spec)[0]
    assert (moe.experts, moe.top_k, moe.shared_intermediate) == (64, 6, 2 * 1408)


def test_qwen2_projections_carry_biases_and_never_hold_partial_sums():
    from tpplan.layout.rules import strategies
    from tpplan.models.numerics import Numerics
    from tpplan.models.opkinds import params_for_op
    from tpplan.placement import P

    g = build_model_graph(load_model("qwen2-7b"))
    lg = g.kinds["gqa+dense"]
    for name in ("q_proj", "k_proj", "v_proj"):
        op = _op(g, "gqa+dense", name)
        assert params_for_op(op, Numerics())["bias"] == (f"self_attn.{name}.bias", (op.weight_shape[0],))
        # replicated, an affine map must not run on partial sums (the bias would be added N times)
        assert all(P not in s.inputs for s in strategies(op, WeightSplit.REPLICATED, lg.values))
    assert "bias" not in params_for_op(_op(g, "gqa+dense", "o_proj"), Numerics())
    assert any(P in s.inputs for s in strategies(_op(g, "gqa+dense", "o_proj"), WeightSplit.REPLICATED, lg.values))


def test_qwen3_5_moe_reads_its_text_config_with_split_gdn_projections():
    from tpplan.models.numerics import Numerics
    from tpplan.models.opkinds import ShardCtx, op_kind, params_for_op

    spec = load_model("qwen3.5-397b-a17b")  # trimmed copy: no rope_parameters, so partial rotary 0.25 by default
    assert spec.family == "qwen3_5" and spec.model_type == "qwen3_5_moe" and spec.num_layers == 60
    kinds = [layer.attn.kind for layer in spec.layers]
    assert kinds.count("gdn") == 45 and kinds[3::4] == ["gqa"] * 15
    moe = _moe_of(spec)
    assert len(moe) == 60 and (moe[0].experts, moe[0].top_k, moe[0].shared_intermediate) == (512, 10, 1024)
    assert moe[0].shared_gate and spec.layers[3].attn.rotary_dim == 64 and spec.layers[3].attn.output_gate
    g = build_model_graph(spec)
    qkvz = _op(g, "gdn+moe", "in_proj_qkvz")
    k, v = 16 * 128, 64 * 128  # key_dim, value_dim
    assert qkvz.weight_shape == (2 * k + 2 * v, 4096)
    assert params_for_op(qkvz, Numerics()) == {
        "part0": ("linear_attn.in_proj_qkv.weight", (2 * k + v, 4096)),
        "part1": ("linear_attn.in_proj_z.weight", (v, 4096)),
    }
    # TP8 rank 3 owns key heads 6 and 7: their rows of q, of k and of v (4 v heads per key head), and of z
    sc = ShardCtx("col", None, 8, 3)
    cuts = op_kind(OpKind.LINEAR).cuts(qkvz, params_for_op(qkvz, Numerics()), sc)
    assert cuts["part0"].ranges == ((768, 1024), (k + 768, k + 1024), (2 * k + 3072, 2 * k + 4096))
    assert cuts["part1"].ranges == ((3072, 4096),)
    ba = _op(g, "gdn+moe", "in_proj_ba")
    assert op_kind(OpKind.LINEAR).cuts(ba, params_for_op(ba, Numerics()), sc)["part1"].ranges == ((24, 32),)


def test_qwen3_5_dense_and_35b_read_rope_parameters():
    spec = load_model("qwen3.6-27b")
    assert spec.model_type == "qwen3_5" and spec.num_layers == 64
    assert {layer.mlp.kind for layer in spec.layers} == {"dense"} and spec.layers[0].mlp.intermediate == 17408
    assert spec.layers[0].attn.v_heads == 48 and spec.layers[3].attn.heads == 24
    assert spec.layers[3].attn.rotary_dim == 64
    small = load_model("qwen3.5-35b-a3b")
    assert small.num_layers == 40 and _moe_of(small)[0].experts == 256 and small.layers[3].attn.rotary_dim == 64


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"model_type": "qwen3_5_moe"}, "must wrap a text_config"),
        ({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_moe_text"}}, "use 'qwen3_5_text'"),
    ],
)
def test_qwen3_5_wrapper_errors_name_the_field(raw, needle):
    from tpplan.errors import TpplanError
    from tpplan.models.config import spec_from_config

    with pytest.raises(TpplanError) as err:
        spec_from_config(raw, label="config.json")
    assert needle in str(err.value) and "text_config" in str(err.value)


def test_qwen3_and_mistral_presets_match_the_published_shapes():
    q = build_model_graph(load_model("qwen3-32b"))
    assert q.spec.num_layers == 64 and q.spec.layers[0].attn.qk_norm
    assert _op(q, "gqa+dense", "q_proj").weight_shape == (64 * 128, 5120)  # explicit head_dim: wider than hidden
    assert _op(q, "gqa+dense", "k_proj").weight_shape == (8 * 128, 5120)
    m = build_model_graph(load_model("mistral-7b-v0.3"))
    assert m.spec.vocab == 32768 and not m.spec.layers[0].attn.qk_norm
    assert _op(m, "gqa+dense", "k_proj").weight_shape == (8 * 128, 4096)  # head_dim = 4096 / 32
    assert _op(m, "gqa+dense", "gate_proj").weight_shape == (14336, 4096)


def test_qwen3_5_text_config_alone_reads_like_the_wrapper():
    from tpplan.models.config import load_config_dict, spec_from_config

    raw, _ = load_config_dict("qwen3.5-35b-a3b")
    wrapped, alone = spec_from_config(raw), spec_from_config(raw["text_config"])
    assert alone.model_type == "qwen3_5_moe_text" and alone.layers == wrapped.layers
