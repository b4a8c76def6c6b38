"""pydantic's validation errors in meshconf's words: which key, what was expected, and a hint
for a likely typo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from meshconf.core.errors import KeyPath, describe_value
from meshconf.core.messages import did_you_mean
from meshconf.model.config import MeshConfig


def model_at(path: KeyPath) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path``, if any."""
    model: type[BaseModel] = MeshConfig
    for part in path:
        info = model.model_fields.get(str(part))
        annotation = info.annotation if info else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return None
    return model


def translate(error: Mapping[str, Any]) -> tuple[KeyPath, str]:
    """The key and the message for one of pydantic's error entries."""
    path: KeyPath = tuple(error["loc"])
    kind = error["type"]
    if path and path[-1] == "[key]":
        return path[:-1], f"invalid key: {error['msg']}"
    if kind == "invalid_key":
        return path[:-1], f"key {path[-1]!r} is not a string; meshconf keys are names"
    if kind == "extra_forbidden":
        model = model_at(path[:-1])
        allowed = list(model.model_fields) if model else []
        hint = did_you_mean(str(path[-1]), allowed)
        where = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return path, f"unknown key {path[-1]!r}{hint}{where}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return path, f"expected a mapping, got {describe_value(error['input'])}"
    if kind in ("tuple_type", "list_type"):
        return path, f"expected a list, got {describe_value(error['input'])}"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        got = error["input"]
        options = [option.strip(" '") for option in expected.replace(" or ", ", ").split(",")]
        hint = did_you_mean(got, options) if isinstance(got, str) else ""
        return path, f"expected {expected}, got {describe_value(got)}{hint}"
    return path, str(error["msg"])


def key_hint(value: Any, key: str | int) -> str:
    """An unknown top-level key holding a meshconf block: the user forgot ``--key``."""
    if isinstance(value, Mapping) and set(value) & set(MeshConfig.model_fields):
        return f" (to check the meshconf block under it, pass --key {key})"
    return ""
