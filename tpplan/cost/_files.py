"""Loading of validated TOML/JSON input files, so every bad file gives the same kind of error."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from tpplan.errors import TpplanError, validated

M = TypeVar("M", bound=BaseModel)


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a .toml or .json file into a dict; syntax errors name the file and the position."""
    if not path.is_file():
        raise TpplanError(str(path), "file not found", "pass an existing .toml/.json file or a preset name")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise TpplanError(str(path), f"unknown file type {suffix!r}", "use a .toml or .json file")
    except tomllib.TOMLDecodeError as exc:
        raise TpplanError(str(path), f"malformed TOML ({exc})", "fix the TOML syntax") from None
    except json.JSONDecodeError as exc:
        raise TpplanError(str(path), f"malformed JSON ({exc})", "fix the JSON syntax") from None
    if not isinstance(data, dict):
        raise TpplanError(str(path), "top level is not a table/object", "wrap the fields in an object")
    return data


def validate(model: type[M], data: dict[str, Any], where: str) -> M:
    """Validate `data`; the first pydantic error becomes a TpplanError naming file and field."""
    return validated(model, data, where, "correct field '{field}' in " + where)
