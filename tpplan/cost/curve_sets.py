"""Shipped sets of measured collective curves that a cluster file names instead of inlining them.

A set (`presets/curves/NAME.json`) holds one table's curves (kind x algorithm x ranks, points in
nccl-tests' size convention) with its provenance; `tpplan.cost.sources.aic_curves` extracted the
shipped ones from AIConfigurator's NCCL tables once, so pricing needs neither that package nor
network access. A cluster file says

    curve_sets = ["h200_sxm-nccl-2.29.2"]                          # every curve of the set
    curve_sets = [{ name = "h200_sxm-nccl-2.29.2", skip = ["all_reduce@8"] }]   # all but these
    curve_sets = ["h200_sxm-nccl-2.29.2", "h200_sxm-sglang-eager-0.5.14-allreduce"]  # plus an engine AR

and loading expands the names into the cluster's `curves` (its own `[[curves]]` first), so a
topology, its TOML dump and every pricer see plain `CollectiveCurve`s.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from pydantic import Field

from tpplan.cost.gpu import Strict
from tpplan.errors import TpplanError, unknown_name, validated
from tpplan.inputs import parse_json

_DIR = ("presets", "curves")


class CurveSetRef(Strict):
    """One named set, optionally without some of its (kind, ranks) curves ("all_reduce@8")."""

    name: str = Field(min_length=1)
    skip: list[str] = Field(default_factory=list, description="curves left out, as 'kind@ranks'")


def list_curve_sets() -> list[str]:
    """Names of the packaged curve sets."""
    root = resources.files("tpplan.cost").joinpath(*_DIR)
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


@cache
def curve_set(name: str) -> dict[str, Any]:
    """One packaged set as parsed JSON (name, source, aic_version, curves, ...)."""
    if name not in list_curve_sets():
        raise unknown_name("curve set", name, list_curve_sets(), "curve_sets", "ls tpplan/cost/presets/curves")
    where = f"curve set {name}"
    return parse_json(resources.files("tpplan.cost").joinpath(*_DIR, f"{name}.json").read_text(), where,
                      "reinstall tpplan")  # fmt: skip


def expand_curve_sets(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` (a cluster or flat topology mapping) with its `curve_sets` turned into `curves`."""
    refs = data.get("curve_sets")
    if refs is None:
        return data
    if not isinstance(refs, list):
        raise TpplanError(f"{where}: curve_sets", "must be a list of set names or {name, skip} tables",
                          'write curve_sets = ["h200_sxm-nccl-2.29.2"]')  # fmt: skip
    curves = list(data.get("curves") or [])
    for ref in refs:
        spec = validated(CurveSetRef, {"name": ref} if isinstance(ref, str) else ref, where,
                         "correct field 'curve_sets.{field}' in " + where)  # fmt: skip
        held = curve_set(spec.name)["curves"]
        keys = list(dict.fromkeys(f"{c['kind']}@{c['ranks']}" for c in held))
        unknown = sorted(set(spec.skip) - set(keys))
        if unknown:
            raise TpplanError(f"{where}: curve_sets {spec.name} skip {unknown[0]!r}", "the set has no such curve",
                              f"use one of {', '.join(keys)}")  # fmt: skip
        curves.extend(c for c in held if f"{c['kind']}@{c['ranks']}" not in spec.skip)
    return {**{k: v for k, v in data.items() if k != "curve_sets"}, "curves": curves}


__all__ = ["CurveSetRef", "curve_set", "expand_curve_sets", "list_curve_sets"]
