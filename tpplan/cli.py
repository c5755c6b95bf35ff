"""Command-line entry point. A thin layer: every command calls the Python API and prints it.

Each command lives in `tpplan.commands.<name>` and registers itself on the app; modules whose
commands need torch import it lazily inside the command, so `tpplan audit` never loads torch.
"""

from __future__ import annotations

import re
import sys

import typer
from rich.markup import escape

from tpplan.errors import TpplanError

app = typer.Typer(
    name="tpplan",
    help="Audit, predict, search, execute and measure tensor-parallel prefill plans.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

RUNTIME_MODULES = ("torch", "safetensors")  # what `tpplan[runtime]` installs: verify, run, bench, calibrate
_COMMAND_MODULES = ("models_cmd", "audit", "calibrate", "verify", "search", "run", "bench", "report")


def _register_commands() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"tpplan.commands.{name}").register(app)


_register_commands()

# The library's errors name what they were given as `field=value` (`tp=7`, `memory_cap_gib=-1`); at
# the CLI's edge they name the option that set it (`--tp 7`, `--memory-cap -1`).
FLAG_OF = {
    "tp": "--tp",
    "pp": "--pp",
    "replicas": "--replicas",
    "router": "--router",
    "overlap": "--overlap",
    "dtype": "--dtype",
    "expert_dtype": "--expert-dtype",
    "memory_cap_gib": "--memory-cap",
    "objective": "--objective",
    "top": "--top",
    "tokens": "--tokens",
    "topology": "--topology",
    "cp_kv": "--cp-kv",
    "arrival_rate": "--arrival-rate",
    "pd": "--pd",
    "requests": "--requests",
    "cp": "--cp",
    "cp_layers": "--cp-layers",
    "plan": "--plan",
    "engine": "--engine",
    "weights": "--weights",
    "nodes": "--nodes",
    "workload": "--workload",
    "trace": "--trace",
    "force": "--force",
    "chunk": "--chunk",
    "experts": "--experts",
    "iters": "--iters",
    "warmup": "--warmup",
    "kernels": "--kernels",
    "overhead": "--overhead",
    "timing": "--timing",
    "kernels_from": "--kernels-from",
    "target_topology": "--target-topology",
    "target_nodes": "--target-nodes",
    "timeout_s": "--timeout",
    "direct_iters": "--direct-iters",
    "nproc": "--nproc",
    "backend": "--backend",
    "from_files": "--from",
    "ttft_target": "--ttft-target",
    "tpot_target": "--tpot-target",
    "target_stat": "--target-stat",
    "redundant_experts": "--ep-num-redundant-experts",
    "spec_method": "--spec",
    "spec_draft": "--spec DRAFT",
}
_NAMES = "|".join(sorted(FLAG_OF, key=len, reverse=True))
# a value runs to the next space, or to a `/` that starts the next field (`iters=/warmup=`)
_FIELD = re.compile(rf"\b({_NAMES})=((?:(?!/(?:{_NAMES})=)\S)*)")


def as_flags(exc: TpplanError) -> TpplanError:
    """`exc` with each `field=value` it names written as the CLI option (`value` None: the option alone)."""

    def flag(m: re.Match[str]) -> str:
        value = m[2].rstrip(",.;")
        return FLAG_OF[m[1]] + ("" if value in ("", "None") else f" {value}") + m[2][len(value) :]

    return TpplanError(_FIELD.sub(flag, exc.where), _FIELD.sub(flag, exc.reason), _FIELD.sub(flag, exc.fix))


def usage_error(exc: Exception) -> TpplanError:
    """click's usage error (its usage line, a hint and the message on four lines) as one line: the
    command, what was wrong, and where the options are listed."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "tpplan"
    reason = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]  # click's, matched by shape
    return TpplanError(command, reason, f"`{command} --help` lists its options")


def json_without_file(argv: list[str]) -> list[str]:
    """`--json` given no FILE means `--json -` (print the JSON): typer has no options whose value is
    optional, so the CLI fills it in. No FILE = the last word, or the next word is another option."""
    out = list(argv)
    for i, word in enumerate(argv):
        if word == "--json" and (i + 1 == len(argv) or (argv[i + 1].startswith("-") and argv[i + 1] != "-")):
            out[i] = "--json=-"
    return out


def main() -> None:
    """Run the CLI; user errors print one clear message and exit 2 without a traceback. SIGINT,
    SIGTERM and SIGHUP unwind the command (its cleanup runs whole, `tpplan.signals`) and exit 130,
    143 and 129; a second signal during that cleanup changes nothing."""
    from tpplan.signals import exit_cleanly

    try:
        with exit_cleanly():
            _main()
    except KeyboardInterrupt:  # one that click did not turn into Abort (it came during click's own handling)
        sys.exit(130)


def _main() -> None:
    from tpplan.text import TextConsole

    err = TextConsole(stderr=True)
    try:
        rc = app(args=json_without_file(sys.argv[1:]), prog_name="tpplan", standalone_mode=False)
    except TpplanError as exc:
        shown = as_flags(exc)
        # one line in files and pipes (grep-able); wrapped at the terminal's width, at most 100, in a terminal
        tty = err.is_terminal
        width = min(err.width, 100) if tty else None
        err.print(f"[bold red]error:[/] {escape(str(shown))}", markup=True, soft_wrap=not tty, width=width)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in RUNTIME_MODULES:
            raise
        what = f"tpplan {sys.argv[1]}" if len(sys.argv) > 1 else "this command"
        line = f'{what}: needs {missing}, which is not installed. Fix: pip install "tpplan[runtime]"'
        err.print(f"[bold red]error:[/] {escape(line)}", markup=True, soft_wrap=True)
        sys.exit(2)
    except Exception as exc:
        # typer bundles its own click: match its usage errors by shape, not by class
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            usage = as_flags(usage_error(exc))
            err.print(f"[bold red]error:[/] {escape(str(usage))}", markup=True, soft_wrap=True)
            sys.exit(2)
        raise
    if isinstance(rc, int) and rc:
        sys.exit(rc)
