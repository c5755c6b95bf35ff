"""Names that say what they are, old names still accepted, and "did you mean" for typos (issue 21)."""

from __future__ import annotations

import pytest

from tpplan.cost.topology import load_topology
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
    ],
)
def test_a_typo_gets_did_you_mean_not_the_whole_list(load, typo, meant):
    with pytest.raises(TpplanError) as exc:
        load(typo)
    msg = str(exc.value)
    assert f"did you mean {meant}?" in msg and len(msg) < 250, msg


def test_no_close_name_points_at_the_listing_command():
    with pytest.raises(TpplanError, match="`tpplan models` lists them all"):
        load_model("zzqqxx")


def test_a_folder_without_config_json_says_so(tmp_path):
    with pytest.raises(TpplanError, match=r"the folder has no config\.json"):
        load_model(str(tmp_path))
