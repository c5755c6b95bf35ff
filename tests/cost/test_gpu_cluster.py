"""The GPU model / cluster split: small topology files naming the two, old single files, --gpu and
--cluster, one-line errors for nonsense hardware, and the Mesh check."""

from __future__ import annotations

import pytest

from tpplan.cost.topology import (
    Topology,
    list_clusters,
    list_gpus,
    load_cluster,
    load_gpu,
    load_topology,
    select_topology,
    topology_to_toml,
)
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

# h200x8-ib400 as one file, as it was before the split (inline [gpu], cluster fields at the top).
OLD_H200X8 = """name = "h200x8-ib400"
nodes = 4
gpus_per_node = 8
launch_us = 20.0

[gpu]
name = "NVIDIA H200"
bf16_tflops = 989.0
fp8_tflops = 1979.0
hbm_TBps = 4.8
memory_GiB = 140.0

[intra]
kind = "nvlink"
bandwidth_GBps = 360.0
latency_us = 1.0

[inter]
nics_per_node = 8
nic_Gbps = 400.0
latency_us = 5.0
efficiency = 0.9
"""


def _write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_old_single_file_and_composed_preset_price_the_same_hardware(tmp_path) -> None:
    old = load_topology(_write(tmp_path, "old.toml", OLD_H200X8))
    new = load_topology("h200x8-ib400-datasheet")
    skip = {"name", "gpu", "gpu_preset", "cluster_preset", "provenance"}  # provenance: words, not hardware
    assert {k: v for k, v in old.model_dump().items() if k not in skip} == {
        k: v for k, v in new.model_dump().items() if k not in skip
    }
    for field in ("bf16_tflops", "fp8_tflops", "hbm_TBps", "memory_GiB", "kernel_models", "gemm_table", "name"):
        assert getattr(old.gpu, field) == getattr(new.gpu, field), field
    assert new.gpu_preset == "h200-datasheet" and new.cluster_preset == "h200x8-ib400"


def test_the_measured_h200_prices_every_h200_cluster_by_default() -> None:
    measured = load_gpu("h200-measured")
    serving = load_topology("h200-serving").gpu.kernel_models
    for name, consts in measured.kernel_models.items():
        if name.startswith("attention"):  # the same intercept, split into the kernel's and tpplan's host overhead
            assert consts["a_s"] + consts["host_s"] == pytest.approx(serving[name]["a_s"], rel=1e-12)
            assert {k: v for k, v in consts.items() if k not in ("a_s", "host_s")} == {
                k: v for k, v in serving[name].items() if k != "a_s"
            }
        else:
            assert consts == serving[name], name
    for name in ("h200x8-ib400", "h200x8-ib400-nvls"):
        assert load_topology(name).gpu == measured, name
        assert load_cluster(name).gpu == "h200-measured"
    capped = load_topology("h200-serving-capped").gpu.kernel_models
    assert load_gpu("h200-measured-capped").kernel_models["experts"] == capped["experts"]
    assert {"h200-datasheet", "h200-measured", "h100-datasheet", "rtxpro6000-datasheet"} <= set(list_gpus())
    assert {"h200x8-ib400", "pcie8-rtxpro6000"} <= set(list_clusters())


def test_gpu_and_cluster_options_replace_either_half() -> None:
    t = select_topology("h200x8-ib400", 2, gpu="h200-datasheet")
    assert t is not None and t.gpu == load_gpu("h200-datasheet") and t.world_size == 16
    assert t.intra == load_cluster("h200x8-ib400").intra
    c = select_topology(None, None, cluster="pcie8-rtxpro6000")  # a cluster alone: with the GPU it names
    assert c is not None and c.gpu == load_gpu("rtxpro6000-datasheet") and c.intra.kind == "pcie"
    both = select_topology("h200-serving", 4, cluster="h200x8-ib400")  # the fix the error names
    assert both is not None and both.world_size == 32 and both.gpu.kernel_models
    assert select_topology(None) is None
    with pytest.raises(TpplanError, match="needs a cluster"):
        select_topology(None, gpu="h200-measured")


def test_multi_node_on_a_one_node_cluster_is_one_short_line() -> None:
    with pytest.raises(TpplanError) as exc:
        load_topology("h200-serving", nodes=4)
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 300 and "--cluster" in msg and "kernel_models" not in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpus_per_node", "1000000"), ("nodes", str(10**23)), ("launch_us", "inf"), ("launch_us", "nan")],
)
def test_cluster_fields_are_bounded(tmp_path, field: str, value: str) -> None:
    text = OLD_H200X8.replace(f"\n{field} = ", f"\n{field} = {value}\n_old_{field} = ", 1)
    text = text.replace(f"_old_{field} = ", "# ")
    with pytest.raises(TpplanError) as exc:
        load_topology(_write(tmp_path, "t.toml", text))
    msg = str(exc.value).replace(str(tmp_path), "<tmp>")  # the length of the line, not of pytest's tmp path
    assert "\n" not in msg and len(msg) < 300


@pytest.mark.parametrize(
    ("field", "value"),
    [("bf16_tflops", "inf"), ("hbm_TBps", "1e-300"), ("hbm_TBps", "inf"), ("memory_GiB", "inf"), ("fp8_tflops", "-1")],
)
def test_gpu_fields_are_bounded_and_finite(tmp_path, field: str, value: str) -> None:
    gpu = "\n".join(
        f"{k} = {value if k == field else v}"
        for k, v in (("bf16_tflops", 989.0), ("fp8_tflops", 1979.0), ("hbm_TBps", 4.8), ("memory_GiB", 140.0))
    )
    path = _write(tmp_path, "g.toml", f'name = "x"\n{gpu}\n')
    with pytest.raises(TpplanError, match=field):
        load_topology("h200x8-ib400", gpu=path)
    with pytest.raises(TpplanError, match="--nodes"):
        load_topology("h200x8-ib400", nodes=10**23)  # the node count, before anything reads it


def test_huge_node_count_exits_2_at_once(monkeypatch, capsys) -> None:
    from tests.cli_helpers import run_cli

    code, _out, err = run_cli(monkeypatch, capsys, "search", "-m", "tiny-llama", "-t", "h200x8-ib400",
                             "--nodes", str(10**23))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--nodes" in err


def test_composed_topology_roundtrips_through_toml(tmp_path) -> None:
    topo = load_topology("h200x8-ib400", nodes=2)
    path = _write(tmp_path, "r.toml", topology_to_toml(topo))
    assert load_topology(path) == topo
    assert Topology.compose(load_gpu("h200-measured"), load_cluster("h200x8-ib400"), "h200x8-ib400", nodes=2) == (
        topo.model_copy(update={"gpu_preset": None})
    )


def test_deployment_is_checked_once_against_the_cluster() -> None:
    topo = load_topology("h200x8-ib400")
    assert Mesh(32).check(topo).nodes(topo.gpus_per_node) == 4
    assert Mesh(8, pp=4).ranks_per_node(8) == 8
    with pytest.raises(TpplanError, match="needs 64 GPUs"):
        Mesh(32, pp=2).check(topo)
    with pytest.raises(TpplanError, match="fill whole nodes"):
        Mesh(12).check(topo)
    with pytest.raises(TpplanError, match="must divide"):
        Mesh(8, ep=3).check(topo)


def test_host_overhead_is_charged_only_for_tpplans_own_runtime() -> None:
    """h200-measured's attention: the kernel's per-call cost for a forward prediction (a serving engine),
    plus tpplan's host overhead when a recorded run of tpplan's runtime is re-predicted (impls given)."""
    from tpplan.cost.kernel_models import KernelModels

    consts = load_gpu("h200-measured").kernel_models
    serving = load_topology("h200-serving").gpu.kernel_models
    args = (8, 1024, 0, 192, 192, 1e9)
    engine = KernelModels(consts, charge_host=False).attention(*args)
    runtime = KernelModels(consts, charge_host=True).attention(*args)
    assert engine is not None and runtime is not None
    assert runtime - engine == pytest.approx(consts["attention_causal"]["host_s"], rel=1e-9)
    assert runtime == pytest.approx(KernelModels(serving, charge_host=False).attention(*args), rel=1e-12)


def test_a_calibrated_topology_file_serves_as_a_gpu_model(tmp_path) -> None:
    """What `tpplan calibrate` writes (a whole topology) gives its [gpu] table to --gpu: the measured
    2-GPU models on a 4 x 8 cluster in one option."""
    serving = load_topology("h200-serving")
    path = _write(tmp_path, "mine.toml", topology_to_toml(serving))
    t = select_topology("h200x8-ib400", 4, gpu=path)
    assert t is not None and t.gpu == serving.gpu and t.world_size == 32 and t.name.endswith("+mine")


def test_cli_gpu_and_cluster_options(monkeypatch, capsys) -> None:
    from tests.cli_helpers import run_cli

    base = ("audit", "-m", "tiny-llama", "--tp", "2", "--json")
    code, out, err = run_cli(monkeypatch, capsys, *base, "--cluster", "pcie8-rtxpro6000", "--nodes", "1")
    assert code == 0, err
    import json

    preds = [p["prediction"] for p in json.loads(out)["plans"] if p.get("prediction")]
    assert preds and all(p["topology"] == "pcie8-rtxpro6000" for p in preds)
    code, out, err = run_cli(monkeypatch, capsys, *base, "-t", "h200x8-ib400", "--gpu", "h100-datasheet")
    assert code == 0, err
    assert all(p["prediction"]["topology"] == "h200x8-ib400+h100-datasheet" for p in json.loads(out)["plans"]
               if p.get("prediction"))  # fmt: skip
    code, _out, err = run_cli(monkeypatch, capsys, *base, "--gpu", "h100-datasheet")
    assert code == 2 and "needs a cluster" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("body", "named"),
    [('cluster = ""', "cluster: is empty"), ('cluster = "h200x8-ib400"\ngpu = ""', "gpu: is empty"),
     ('cluster = "h200x8-ib400"\ngpu = "nope"', "gpu nope: no such preset"),
     ('cluster = "nope"', "cluster nope: ")],
)  # fmt: skip
def test_a_preset_a_topology_file_names_is_refused_naming_the_file_and_field(tmp_path, body, named):
    """Found by the fuzz suite (issue 35): gpu = "" in a topology file was read as the current folder
    ("error: .: unknown file type"), and a GPU name it lacked was blamed on a --gpu nobody passed."""
    from tpplan.cost.topology import load_topology
    from tpplan.errors import TpplanError

    f = tmp_path / "t.toml"
    f.write_text(f'name = "t"\n{body}\n')
    with pytest.raises(TpplanError) as got:
        load_topology(str(f))
    assert str(got.value).startswith(f"{f}: {named}")
    assert "--gpu" not in str(got.value).split(". Fix:")[0]
