"""Names that say what they are, old names still accepted, and "did you mean" for typos (issue 21)."""

from __future__ import annotations

import pytest

from tpplan.cost.topology import load_gpu, load_topology
from tpplan.cost.workload import load_workload
from tpplan.errors import TpplanError
from tpplan.models.config import load_model


@pytest.mark.parametrize(("old", "new"), [("seed-c8", "prompt16k-c8"), ("seed-c16", "prompt16k-c16")])
def test_old_workload_names_load_the_renamed_preset(old, new):
    assert load_workload(old) == load_workload(new)
    assert load_workload(old).name == new


@pytest.mark.parametrize(
    ("load", "typo", "meant"),
    [
        (load_model, "kimi-k33", "kimi-k3"),
        (load_model, "deepseekv3", "deepseek-v3"),
        (load_model, "llama-3-70B", "llama-3-70b"),
        (load_topology, "H200x8-ib40", "h200x8-ib400"),
        (load_workload, "prompt16k-C8", "prompt16k-c8"),
        (load_gpu, "l40s", "l40s-datasheet"),  # a GPU's short name: the presets that start with it
        (load_gpu, "b200", "b200-datasheet"),
    ],
)
def test_a_typo_gets_did_you_mean_not_the_whole_list(load, typo, meant):
    with pytest.raises(TpplanError) as exc:
        load(typo)
    msg = str(exc.value)
    assert f"did you mean {meant}?" in msg and len(msg) < 250, msg


@pytest.mark.parametrize(
    ("typo", "meant"), [("sp-mo", "sp-moe"), ("gate-awre", "gate-aware"), ("Baseline", "baseline")]
)
def test_a_plan_typo_gets_did_you_mean_not_the_whole_list(monkeypatch, capsys, typo, meant):
    """Issue 33: a mistyped --plan printed every plan and form (~600 characters); now the closest name."""
    from cli_helpers import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-qwen3", "--tp", "2", "--plan", typo)
    assert code == 2 and f"did you mean {meant}?" in err and len(err) < 150, err


def test_no_close_name_points_at_the_listing_command():
    with pytest.raises(TpplanError, match="`tpplan models` lists them all"):
        load_model("zzqqxx")


def test_a_folder_without_config_json_says_so(tmp_path):
    with pytest.raises(TpplanError, match=r"no config\.json in folder"):
        load_model(str(tmp_path))


@pytest.mark.parametrize(("command", "lister"), [("topologies", "list_topologies"), ("workloads", "list_workloads")])
def test_listing_commands_show_every_preset_on_one_line(monkeypatch, capsys, command, lister):
    from cli_helpers import run_cli

    import tpplan.cost.topology as topology
    import tpplan.cost.workload as workload

    names = getattr(topology if command == "topologies" else workload, lister)()
    code, out, _ = run_cli(monkeypatch, capsys, command)
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == len(names)  # one line per preset: no wrapped cells
    assert [row.split("│")[1].strip() for row in rows] == names
    assert all(len(line) <= 100 for line in out.splitlines())


def test_workloads_show_their_output_tokens(monkeypatch, capsys):
    """A workload's output tokens decide whether decode is served (TPOT targets need more than one): the
    listing shows them beside the prompt."""
    from cli_helpers import run_cli

    from tpplan.cost.workload import list_workloads, load_workload

    code, out, _ = run_cli(monkeypatch, capsys, "workloads")
    assert code == 0
    rows = {
        row.split("│")[1].strip(): [c.strip() for c in row.split("│")] for row in out.splitlines() if row[:1] == "│"
    }
    for name in list_workloads():
        assert f"{load_workload(name).output_len:,}" == rows[name][3], name


def test_model_and_tp_have_no_hidden_defaults(monkeypatch, capsys):
    from cli_helpers import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "qwen2-7b")
    assert code == 2 and "--tp" in err and "32" not in err
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--tp", "2")
    assert code == 2 and "--model" in err


def test_bench_runs_no_model_it_was_not_given(monkeypatch, capsys, tmp_path):
    """A bench run without --model is one line naming it (it ran kimi-k3 before); --from needs none."""
    from cli_helpers import run_cli

    out = tmp_path / "r.json"
    code, _, err = run_cli(monkeypatch, capsys, "bench", "-p", "baseline", "--backend", "gloo", "--out", str(out))
    assert code == 2 and "--model" in err and "kimi" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_preset_cluster_is_one_node_unless_tp_needs_more():
    from tpplan.commands._options import cluster_text, load_cluster

    assert load_cluster("h200x8-ib400", None).nodes == 1
    assert load_cluster("h200x8-ib400", None, gpus=32).nodes == 4
    assert load_cluster("h200x8-ib400", 2, gpus=8).nodes == 2
    assert cluster_text(load_cluster("h200x8-ib400", None, gpus=32)) == "h200x8-ib400 (4 x 8 GPUs)"
