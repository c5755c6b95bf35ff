"""Context parallelism executed for real: CP 2 and 4 gloo ranks (TP 1 each) against the one-process
reference and transformers, every rank's traced CP calls against the lowered program's CP steps
(`lower.schedule.predict_cp_calls`)."""

from __future__ import annotations

import pytest
import torch

from tpplan.layout.context_parallel import audit_cp, model_split, rank_positions
from tpplan.lower.schedule import predict_cp_calls
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.runtime.context_parallel_verify import verify_cp

FAMILIES = ("tiny-llama", "tiny-deepseek-v3", "tiny-qwen3-next", "tiny-kimi-k3", "tiny-kimi-linear")


def _calls(calls) -> list[tuple]:
    return [(c.layer, c.kind, c.op, c.value, c.nbytes) for c in calls]


def test_predicted_calls_follow_the_split_and_the_ranks_role() -> None:
    """Fast: what the trace will be compared to (all-gathers padded to the longest rank; rank 0
    receives no state)."""
    g = build_model_graph(load_model("tiny-kimi-k3"))
    mesh = Mesh(1, cp=4, cp_recurrence="serial")
    assert model_split(audit_cp(g, mesh)) == "contiguous"
    plan = make_plan("baseline", g, 1)
    first, second = (predict_cp_calls(g, plan, mesh, 19, cp_rank=r) for r in (0, 1))
    assert {c.kind for c in first} == {"all_gather"}  # the MLA latent gathers only
    assert {c.kind for c in second} == {"all_gather", "send_recv"}
    rows = max(len(rank_positions(19, 4, r, "contiguous")) for r in range(4))
    latent = next(c for c in first if c.kind == "all_gather")
    assert latent.nbytes == 4 * rows * (16 + 8) * 4  # kv_lora 16 + rope 8, fp32, 4 ranks


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_cp_equals_the_unsharded_model_and_traces_the_prediction(cp: int) -> None:
    results = verify_cp(list(FAMILIES), Mesh(1, cp=cp, cp_recurrence="serial"), tokens=19, timeout_s=300)
    assert [r["model"] for r in results] == list(FAMILIES)
    for r in results:
        assert r["max_abs_hidden"] < 1e-4 and r["max_rel_logits"] < 1e-5, r["model"]
        assert len(r["traced"]) == cp
        for traced, predicted in zip(r["traced"], r["predicted"], strict=True):
            assert traced and _calls(traced) == _calls(predicted), r["model"]


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_kda_two_pass_scan_equals_the_unsharded_model(cp: int) -> None:
    """The two-pass scan (local scan, all-gather of chunk state + transition, correction) on the
    KDA families: the same numbers, and one all-gather per KDA layer where the serial run sends."""
    results = verify_cp(["tiny-kimi-k3", "tiny-kimi-linear"], Mesh(1, cp=cp, cp_recurrence="scan"), tokens=19,
                        timeout_s=300)  # fmt: skip
    for r in results:
        assert r["max_abs_hidden"] < 1e-4 and r["max_rel_logits"] < 1e-5, r["model"]
        for traced, predicted in zip(r["traced"], r["predicted"], strict=True):
            assert _calls(traced) == _calls(predicted), r["model"]
            assert not [c for c in traced if c.kind == "send_recv" and c.value in ("state", "conv_tail")]
        assert any(c.value == "state+transition" for c in r["traced"][0])


HF = {
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM"),
    "tiny-deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "tiny-qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}


@pytest.mark.slow
def test_cp_with_transformers_weights_equals_transformers(tmp_path) -> None:
    """Transformers' own model on the whole sequence gives the logits the CP run (2 ranks, the same
    weights read from safetensors) assembles from its ranks' rows."""
    transformers = pytest.importorskip("transformers")
    from hf_models import build_hf_model
    from safetensors.torch import save_file

    from tpplan.models.config import load_config_dict
    from tpplan.runtime.weights import normalize_names

    folders = {}
    models = {}
    for name, classes in HF.items():
        raw, _ = load_config_dict(name)
        hf = build_hf_model(transformers, raw, classes)
        weights = normalize_names({k: v.detach().contiguous() for k, v in hf.state_dict().items()})
        folder = tmp_path / name
        folder.mkdir()
        save_file(weights, str(folder / "model.safetensors"))
        folders[name], models[name] = str(folder), hf
    results = verify_cp(list(HF), Mesh(1, cp=2, cp_recurrence="serial"), tokens=13, seed=3, weights=folders,
                        timeout_s=300)  # fmt: skip
    for r in results:
        with torch.no_grad():
            theirs = models[r["model"]](input_ids=r["ids"][None]).logits[0]
        assert (r["logits"] - theirs).abs().max().item() < 1e-4, r["model"]
        assert r["max_rel_logits"] < 1e-5


def test_verify_cp_refuses_what_it_does_not_execute(monkeypatch, capsys) -> None:
    from tests.cli_helpers import run_cli

    refused = [
        (["--tp", "1", "--cp", "2", "--plan", "sp-moe"], "one plan"),
        (["--tp", "1", "--cp", "2", "--chunk", "4"], "--chunk"),
        (["--tp", "1", "--cp", "2", "--dtype", "bf16"], "fp32 on gloo"),
    ]
    for args, word in refused:
        code, _, err = run_cli(monkeypatch, capsys, "verify", "--model", "tiny-llama", "--plan", "baseline", *args)
        assert code == 2 and word in err and "Traceback" not in err


@pytest.mark.slow
def test_verify_cli_runs_cp(monkeypatch, capsys) -> None:
    import json

    from tests.cli_helpers import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "verify", "--model", "tiny-kimi-k3", "--tp", "1", "--cp", "2",
                           "--plan", "baseline", "--tokens", "12", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["passed"]
    (r,) = data["results"]
    assert r["trace_matches_per_rank"] == [True, True] and r["traced_calls"] == r["predicted_calls"] > 0


def _same(a, b) -> bool:
    return _calls(a) == _calls(b)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "plan", "rec"), [("tiny-llama", "baseline", "serial"),
                                                    ("tiny-llama", "sequence-parallel", "serial"),
                                                    ("tiny-deepseek-v3", "baseline", "serial"),
                                                    ("tiny-kimi-k3", "baseline", "serial"),
                                                    ("tiny-qwen3-next", "baseline", "scan")])  # fmt: skip
def test_tp2_x_cp2_runs_the_plan_in_each_tp_group(model: str, plan: str, rec: str) -> None:
    """TP 2 inside each of 2 CP groups (4 gloo ranks): the TP group's PlanRunner on its CP rank's
    tokens, its mixers reaching the other group's same TP rank. Numbers as the unsharded model; CP
    calls as the program lowered at TP 2 x CP 2 lists them; TP calls as `predict_schedule` at the rank's
    own token count.
    Qwen3-Next by the two-pass scan (GDN's heads split over TP inside it)."""
    from tpplan.runtime.context_parallel_verify import verify_tp_cp

    r = verify_tp_cp(model, Mesh(2, cp=2, cp_recurrence=rec), plan=plan, tokens=16, timeout_s=300)
    assert r["max_rel_hidden"] < 1e-5
    assert all(r["tp_trace_matches"])
    assert all(_same(a, b) for a, b in zip(r["cp_traced"], r["cp_predicted"], strict=True))
    assert any(r["cp_traced"])


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_mla_only_cp_equals_the_unsharded_model_and_gathers_only_the_attention_output(cp: int) -> None:
    """`--cp-layers mla` at TP = CP (attention TP 1): KDA/MoE on the full sequence, MLA attention on the
    rank's zigzag rows; the same numbers, and one all-gather of o_proj's rows per MLA layer, as predicted."""
    models = ["tiny-kimi-k3", "tiny-deepseek-v3"] if cp == 2 else ["tiny-kimi-k3"]  # each case under ~20 s
    results = verify_cp(models, Mesh(cp, cp=cp, cp_layers="mla", cp_recurrence="serial"), tokens=19, timeout_s=300)
    for r in results:
        assert r["max_abs_hidden"] < 1e-4 and r["max_rel_logits"] < 1e-5, r["model"]
        g = build_model_graph(load_model(r["model"]))
        mla_layers = [i for i, k in enumerate(g.layer_kinds) if k.startswith("mla")]
        for traced, predicted in zip(r["traced"], r["predicted"], strict=True):
            assert _calls(traced) == _calls(predicted), r["model"]
            assert [c.layer for c in traced] == mla_layers and {c.value for c in traced} == {"attn_out"}


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_gdn_two_pass_scan_equals_the_unsharded_model_and_the_serial_hand_off(cp: int) -> None:
    """Qwen3-Next's Gated DeltaNet by the two-pass scan: the conv halo posted by every rank at once, then
    one all-gather of every rank's state and transition per layer, as predicted, and no state sent on;
    the same logits as the one-process model and as the serial hand-off."""
    meshes = [Mesh(1, cp=cp, cp_recurrence=rec) for rec in ("scan", "serial")]
    scan, serial = verify_cp(["tiny-qwen3-next"], meshes, tokens=19, timeout_s=300)
    assert scan["max_abs_hidden"] < 1e-4 and scan["max_rel_logits"] < 1e-5
    assert (scan["logits"] - serial["logits"]).abs().max() <= 1e-5 * serial["logits"].abs().max()
    for rank, (traced, predicted) in enumerate(zip(scan["traced"], scan["predicted"], strict=True)):
        assert _calls(traced) == _calls(predicted)
        assert not [c for c in traced if c.value == "state"]
        assert len([c for c in traced if c.value == "state+transition"]) == len(
            [k for k in build_model_graph(load_model("tiny-qwen3-next")).layer_kinds if k.startswith("gdn")]
        )
        assert bool([c for c in traced if c.value == "conv_tail"]) == (rank > 0)
