"""Loading of validated TOML/JSON input files, so every bad file gives the same kind of error.

Reading and parsing go through `tpplan.inputs` (regular files only, bounded size, nesting and
integers); this module adds the pydantic validation that names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from tpplan.errors import validated
from tpplan.inputs import load_mapping

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a .toml or .json file into a dict; every problem names the file."""
    return load_mapping(path, str(path), "pass an existing .toml/.json file or a preset name")


def validate(model: type[M], data: dict[str, Any], where: str) -> M:
    """Validate `data`; the first pydantic error becomes a TpplanError naming file and field."""
    return validated(model, data, where, "correct field '{field}' in " + where)
