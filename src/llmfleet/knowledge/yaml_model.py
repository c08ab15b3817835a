"""A catalog file read into its pydantic model, with the one-line errors every catalog gives: the file,
where in it (dotted path), and what is wrong. ``read_catalog`` reads the file; the rest is text in,
model out."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from llmfleet import yamlload
from llmfleet.errors import UsageError

M = TypeVar("M", bound=BaseModel)


def parse_yaml(text: str, path: str, *, keep: bool = False) -> Any:
    """The YAML of ``text``; UsageError naming ``path`` and the parser's first line when it is not YAML."""
    try:
        return yamlload.safe_load(text, keep=keep)
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None


def validated(model: type[M], data: Any, path: str) -> M:
    """``model`` from ``data``; UsageError naming ``path``, the first error's place and its message."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise UsageError(f"{path}: {where}: {err.get('msg')}") from None


def load_model(model: type[M], text: str, path: str, *, keep: bool = False) -> M:
    """``model`` from the YAML ``text`` of the file ``path``."""
    return validated(model, parse_yaml(text, path, keep=keep), path)


def read_catalog(path: Path, what: str) -> str:
    """The text of the catalog file ``path``; UsageError naming it and the system's reason when it cannot
    be read (``what``: "the engine catalog", ...)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror}") from None
