import subprocess
import sys

import pytest

from tpplan.cost.topology import list_topologies, load_topology, topology_to_toml
from tpplan.errors import TpplanError


def test_presets_load_and_roundtrip(tmp_path) -> None:
    names = list_topologies()
    assert {"h200x8-ib400", "h100x8-ib400", "pcie8-rtxpro6000", "h200x2"} <= set(names)
    for name in names:
        topo = load_topology(name)
        out = tmp_path / f"{name}.toml"
        out.write_text(topology_to_toml(topo, header="roundtrip"))
        assert load_topology(str(out)) == topo
    assert load_topology("h200x8-ib400").world_size == 32
    assert load_topology("h200x2").inter is None
    assert load_topology("pcie8-rtxpro6000").intra.kind == "pcie"


def test_nodes_override() -> None:
    assert load_topology("h200x8-ib400", nodes=2).world_size == 16
    with pytest.raises(TpplanError, match="nodes"):
        load_topology("h200x8-ib400", nodes=0)
    with pytest.raises(TpplanError, match="inter"):
        load_topology("h200x2", nodes=2)  # no network section


def _write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


GOOD = """
name = "t"
nodes = 1
gpus_per_node = 4
[gpu]
name = "g"
bf16_tflops = 100
fp8_tflops = 200
hbm_TBps = 1
memory_GiB = 10
[intra]
kind = "pcie"
bandwidth_GBps = 20
latency_us = 2
"""


def test_bad_files_name_file_and_field(tmp_path) -> None:
    assert load_topology(_write(tmp_path, "ok.toml", GOOD)).gpus_per_node == 4
    bad = _write(tmp_path, "bad.toml", GOOD.replace("gpus_per_node = 4", "gpus_per_node = 0"))
    with pytest.raises(TpplanError) as exc:
        load_topology(bad)
    msg = str(exc.value)
    assert "bad.toml" in msg and "gpus_per_node" in msg and "greater than or equal to 1" in msg
    with pytest.raises(TpplanError, match=r"intra.kind"):
        load_topology(_write(tmp_path, "k.toml", GOOD.replace('"pcie"', '"carrier-pigeon"')))
    with pytest.raises(TpplanError, match="malformed TOML"):
        load_topology(_write(tmp_path, "m.toml", "name = \n"))
    with pytest.raises(TpplanError, match="malformed JSON"):
        load_topology(_write(tmp_path, "m.json", "{"))
    with pytest.raises(TpplanError, match="extra_field"):
        load_topology(_write(tmp_path, "x.toml", GOOD + "\nextra_field = 1\n"))
    with pytest.raises(TpplanError, match="no such preset"):
        load_topology("h900x8")
    with pytest.raises(TpplanError, match="no such file"):
        load_topology(str(tmp_path / "missing.toml"))


def test_cli_exit_code_2_on_bad_file(tmp_path) -> None:
    """The CLI shell turns TpplanError into exit 2 (checked through a tiny typer command)."""
    bad = _write(tmp_path, "bad.toml", GOOD.replace("gpus_per_node = 4", "gpus_per_node = 0"))
    code = (
        "import sys, typer; from tpplan import cli\n"
        "from tpplan.cost.topology import load_topology\n"
        "@cli.app.command('probe-topo')\n"
        "def probe(path: str) -> None:\n    load_topology(path)\n"
        "@cli.app.command('other')\n"  # two commands, so typer keeps subcommand dispatch
        "def other() -> None:\n    pass\n"
        f"sys.argv = ['tpplan', 'probe-topo', {bad!r}]\ncli.main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "gpus_per_node" in r.stderr and "Traceback" not in r.stderr
