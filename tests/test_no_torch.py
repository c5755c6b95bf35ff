"""The runtime commands in an environment without torch (the README's first venv): one line naming
the extra to install, exit 2, no traceback (issue 21)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# As tests/test_import_rules.py blocks torch, but failing the way a missing package fails.
NO_TORCH = (
    "import sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
    "for m in [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]:\n"
    "    del sys.modules[m]\n"
    "from tpplan.cli import main\n"
    "sys.argv = ['tpplan', *sys.argv[1:]]\n"
    "main()\n"
)

COMMANDS = [
    ("verify", "--model", "tiny-llama", "--tp", "2", "--plan", "baseline"),
    ("run", "--model", "tiny-llama", "--tp", "2", "--plan", "baseline"),
    ("bench", "--model", "tiny-llama", "--plan", "baseline", "--out", "{tmp}/r.json"),
    ("calibrate", "--out", "{tmp}/t.toml"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_runtime_command_without_torch_names_the_extra(tmp_path, args):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    assert 'pip install "tpplan[runtime]"' in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
