"""Reading a config.json's numbers: a field by any of its names, checked as a positive whole
number, and the model's name from the file's path (hf_config.py and gpt.py read configs alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import finite_number


def _field(cfg: dict[str, Any], path: str, names: tuple[str, ...], default: Any = None) -> Any:
    for name in names:
        if name in cfg and cfg[name] is not None:
            value = cfg[name]
            if not finite_number(value) or value <= 0 or value != int(value):
                raise UsageError(f"config {path!r}: field {name!r} is {value!r}; expected a positive whole number")
            return int(value)
    if default is not None:
        return default
    raise UsageError(
        f'config {path!r} lacks the field {names[0]!r} (a Hugging Face config.json names it, e.g. "{names[0]}": 4096)'
    )


def _name_from_path(path: Path) -> str:
    if path.name == "config.json":
        return path.parent.name or "config"
    return path.name.removesuffix(".json").removesuffix(".config")
