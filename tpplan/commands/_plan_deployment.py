"""A saved plan carries its whole deployment into audit, explain, verify and report.

`tpplan search --save` writes the deployment each plan was ranked at (TP, PP, CP and its layers, KV mode and
recurrence, replicas and their request router; DP attention and overlap are the plan's own decisions) into its file
(`tpplan.plans.files.Deployment`). A command given a plan file takes every deployment option it was not given
from the file. A flag that differs from the file overrides it, with a note on stderr naming both (the file's
decisions may be applied at another size, e.g. a slice or a tiny preset: the audit re-checks them there);
two plan files ranked at different deployments are refused (exit 2), since one run has one deployment.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import typer

from tpplan.commands._console import console, print_wrapped
from tpplan.errors import TpplanError
from tpplan.plans.files import Deployment, is_plan_file, read_plan_file

# the deployment fields a file carries and the option that sets each (EP and the MoE mode are the plan's)
FLAG_OF = {
    "tp": "--tp",
    "pp": "--pp",
    "cp": "--cp",
    "cp_layers": "--cp-layers",
    "cp_recurrence": "--cp-recurrence",
    "cp_kv": "--cp-kv",
    "replicas": "--replicas",
    "router": "--router",
}


@dataclass(frozen=True)
class FromFile:
    """The deployment a command runs at: each field a flag's, a plan file's or the command's default."""

    values: dict[str, object]
    file: str | None  # the plan file it came from (None: no file among the plans)
    notes: tuple[str, ...]

    def __getitem__(self, name: str) -> object:
        return self.values[name]


def file_deployment(plans: Iterable[str] | None, flagged: Iterable[str] = ()) -> tuple[str, Deployment] | None:
    """The deployment the plan files among `plans` were ranked at (None: no file); two that differ in a field
    no flag sets (`flagged`) exit 2."""
    found: tuple[str, Deployment] | None = None
    for name in plans or ():
        if not is_plan_file(name):
            continue
        dep = read_plan_file(name).deployment
        if found is not None and _sizes(found[1], flagged) != _sizes(dep, flagged):
            raise TpplanError(
                f"--plan {found[0]} --plan {name}",
                f"the files were ranked at different deployments ({found[1].label()} and {dep.label()})",
                "pass plan files of one deployment per run, or set the fields they differ in by flags",
            )
        found = found or (name, dep)
    return found


def _sizes(dep: Deployment, flagged: Iterable[str]) -> dict[str, object]:
    return {k: getattr(dep, k) for k in FLAG_OF if k not in set(flagged)}


def flag_given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was set on the command line, not left at its default (click's ParameterSource)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def resolve(ctx: typer.Context, plans: Iterable[str] | None, values: dict[str, object]) -> FromFile:
    """Each deployment option in `values` (a command's, by field name): its value where given on the command
    line, else the plan file's, else the command's default. A flag that differs from the file overrides it,
    noted; what the file holds that the command does not take is noted too."""

    def given(name: str) -> bool:
        return flag_given(ctx, name)

    found = file_deployment(plans, [k for k in values if given(k)])
    out: dict[str, object] = {}
    notes: list[str] = []
    for name, default in values.items():
        saved = getattr(found[1], name) if found is not None else None
        flag = default if given(name) else None
        out[name] = flag if flag is not None else saved if saved is not None else default
        if found is not None and flag is not None and flag != saved:
            notes.append(
                f"{FLAG_OF[name]} {flag} overrides {name}={saved} of plan file {found[0]} (ranked at "
                f"{found[1].label()}); the plan's decisions are applied at {FLAG_OF[name]} {flag}"
            )
    if found is not None:
        unset = Deployment(tp=found[1].tp)  # the defaults: what a file ranked at TP alone holds
        left = [k for k in FLAG_OF if k not in values and getattr(found[1], k) != getattr(unset, k)]
        if left:
            notes.append(
                f"plan file {found[0]} was ranked at {found[1].label()}; this command does not run "
                + ", ".join(f"{FLAG_OF[k]} {getattr(found[1], k)}" for k in left)
                + " (every stage and replica runs the same plan: it checks the plan's TP group over every layer)"
            )
    return FromFile(out, found[0] if found is not None else None, tuple(notes))


def print_deployment_notes(d: FromFile) -> None:
    """The notes on stderr, so stdout stays the result."""
    err = console(stderr=True)
    for note in d.notes:
        print_wrapped(err, f"note: {note}", indent=2)


__all__ = ["FLAG_OF", "FromFile", "file_deployment", "flag_given", "print_deployment_notes", "resolve"]
