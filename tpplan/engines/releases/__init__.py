"""Engine versions, one module each: every module in this package that defines `RELEASES` (a tuple of
`tpplan.engines.schema.EngineVersion`, each with its scheduler rules, KV sizing and P/D hand-off) is
collected into `tpplan.engines.ENGINES`, so `--engine NAME@VERSION`, the serving loop, the KV sizing,
the P/D loop, the engine's default (its newest release) and docs/engines.md pick it up with no edit
elsewhere. docs/adding-an-engine-version.md walks through adding one. Why a folder scan: a version is
data, and a registry list beside it is a second place to forget."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from tpplan.engines.schema import EngineVersion
from tpplan.errors import TpplanError


def discovered(paths: Iterable[str] | None = None) -> tuple[EngineVersion, ...]:
    """The `RELEASES` of every module in this package (or in `paths`, searched as this package), by module name."""
    where = list(__path__ if paths is None else paths)
    out: list[EngineVersion] = []
    for info in sorted(pkgutil.iter_modules(where), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        releases = getattr(module, "RELEASES", ())
        if not isinstance(releases, tuple) or not all(isinstance(r, EngineVersion) for r in releases):
            raise TpplanError(f"{module.__name__}.RELEASES", "is not a tuple of EngineVersion",
                              "define RELEASES = (EngineVersion(...),) in that module")  # fmt: skip
        out += releases
    return tuple(out)


def ordered(versions: Iterable[EngineVersion]) -> tuple[EngineVersion, ...]:
    """Per engine (in order of first appearance), its releases newest first, then its revisions ("main@...")."""
    given = list(versions)
    out: list[EngineVersion] = []
    for engine in dict.fromkeys(ev.engine for ev in given):
        mine = [ev for ev in given if ev.engine == engine]
        out += sorted((ev for ev in mine if ev.release is not None), key=lambda ev: ev.release or (), reverse=True)
        out += [ev for ev in mine if ev.release is None]
    return tuple(out)


def collect(versions: Iterable[EngineVersion]) -> dict[str, EngineVersion]:
    """`key -> version`, in order; a key given twice is refused (two modules claiming one release)."""
    out: dict[str, EngineVersion] = {}
    for ev in versions:
        if ev.key in out:
            raise TpplanError(f"engine {ev.key}", "is defined twice", "keep one module per engine version")
        out[ev.key] = ev
    return out


__all__ = ["collect", "discovered", "ordered"]
