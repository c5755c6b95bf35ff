"""Model families, registered by `model_type`: one module per family.

A family module holds everything tpplan knows about one architecture:
- its raw config schema (pydantic, only the fields tpplan reads) and `build_spec`, which turns a
  raw config.json dict into a `ModelSpec` (one `LayerSpec` per layer);
- the token mixers it introduces (`opkinds.Mixer`: the attention block's graph builder, the HF
  weight names and per-rank cuts of its TOKEN_MIX op, its reference kernel call, its cost class,
  its KV-cache / recurrent-state bytes), registered with `opkinds.register_mixer`;
- its runtime numerics defaults (`numerics`) and, for wrappers (K3), where the text config sits.

The planner (config -> spec -> graph -> audit/cost) uses only the torch-free parts; the runtime
reaches the kernels through the `run` callables, which receive the kernel module from the
executor, so no family module imports torch or `tpplan.runtime` at import time. Every module of
this package not starting with `_` is imported (and so registered) on first use: adding a family
means one module here, its presets and its tests (docs/adding-a-family.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpplan.models.spec import ModelSpec

SpecBuilder = Callable[[dict[str, Any], str, str, str], ModelSpec]  # (raw, label, name, model_type)


def _no_overrides(text: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def _itself(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    return raw


@dataclass(frozen=True)
class Family:
    """One architecture family: the model_types it reads and how.

    `signature`: config fields (or `model_type` prefixes) that mark a config as this family's;
    used only to name the closest supported family for an unknown model_type.
    """

    name: str
    model_types: Mapping[str, str]  # model_type -> one-line description
    build_spec: SpecBuilder
    numerics: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_overrides
    text_config: Callable[[Mapping[str, Any]], Mapping[str, Any]] = _itself
    signature: frozenset[str] = field(default_factory=frozenset)


_FAMILIES: dict[str, Family] = {}
_BY_MODEL_TYPE: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family (called by its module at import); a model_type belongs to one family only."""
    for mt in family.model_types:
        other = _BY_MODEL_TYPE.get(mt)
        if other is not None and other.name != family.name:
            raise ValueError(f"model_type {mt!r} registered by both {other.name} and {family.name}")
        _BY_MODEL_TYPE[mt] = family
    _FAMILIES[family.name] = family
    return family


def family_for(model_type: str) -> Family | None:
    """The family that reads `model_type`, or None."""
    return _BY_MODEL_TYPE.get(model_type)


def families() -> dict[str, Family]:
    """Every registered family by name."""
    return dict(_FAMILIES)


def supported_model_types() -> dict[str, str]:
    """model_type -> description, in registration order."""
    return {mt: desc for f in _FAMILIES.values() for mt, desc in f.model_types.items()}


def closest_family(raw: Mapping[str, Any]) -> tuple[Family, str]:
    """The family whose signature fields the config shares most (ties: registration order), and why."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
    keys = set(raw) | set(text or {})
    best, best_hits = next(iter(_FAMILIES.values())), -1
    for fam in _FAMILIES.values():
        hits = len(fam.signature & keys)
        if hits > best_hits:
            best, best_hits = fam, hits
    shared = sorted(best.signature & keys)
    why = f"shares {', '.join(shared[:4])}" if shared else "no family-specific fields recognised"
    return best, why


for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_m}")
