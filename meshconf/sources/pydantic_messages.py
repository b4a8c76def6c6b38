"""pydantic's validation errors in meshconf's words: which key, what was expected, and a hint
for a likely typo."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from meshconf.core.errors import KeyPath, describe_value
from meshconf.core.messages import did_you_mean
from meshconf.model.config import MeshConfig


def model_at(path: KeyPath) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path``, if any: a field's model, or
    the model of the items of a field that holds a list of them (``levels[0]``)."""
    model: type[BaseModel] = MeshConfig
    index = 0
    while index < len(path):
        info = model.model_fields.get(str(path[index]))
        found = _model_in(info.annotation) if info is not None else None
        if found is None:
            return None
        model, items = found
        index += 2 if items and index + 1 < len(path) and isinstance(path[index + 1], int) else 1
        if items and index == len(path) and not isinstance(path[-1], int):
            return None  # the list itself, not one of its items
    return model


def _model_in(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model an annotation holds, and whether as the items of a list (or tuple)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    items = typing.get_origin(annotation) in (tuple, list)
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found[0], found[1] or items
    return None


def _field(path: KeyPath) -> FieldInfo | None:
    """The field at ``path``, where a model has it."""
    model = model_at(path[:-1]) if path else None
    return model.model_fields.get(str(path[-1])) if model is not None else None


def _clause(sentence: str) -> str:
    """A field's description as the end of a message: no full stop, and in lower case where
    it starts a sentence (``The level's name`` -> ``the level's name``; ``GPUs`` stays)."""
    text = sentence.strip().rstrip(".")
    return text[0].lower() + text[1:] if text[1:2].islower() else text


def written_like(value: Any) -> str:
    """A value as YAML's flow style writes it: ``{nvlink: [tp, ep]}``."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {written_like(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(written_like(item) for item in value) + "]"
    return str(value)


def _such_as(path: KeyPath) -> str:
    """``, such as {nvlink: [tp]}``: the field's first example, or nothing."""
    info = _field(path)
    examples = info.examples if info is not None else None
    return f", such as {written_like(examples[0])}" if examples else ""


def translate(error: Mapping[str, Any]) -> tuple[KeyPath, str]:
    """The key and the message for one of pydantic's error entries."""
    path: KeyPath = tuple(error["loc"])
    kind = error["type"]
    if path and path[-1] == "[key]":
        return path[:-1], f"invalid key: {error['msg']}"
    if kind == "invalid_key":
        key = path[-1]
        # an integer too long to write out as text is described instead
        shown = (
            describe_value(key) if isinstance(key, int) and key.bit_length() > 100 else repr(key)
        )
        return path[:-1], f"key {shown} is not a string; meshconf keys are names"
    if kind == "extra_forbidden":
        model = model_at(path[:-1])
        allowed = list(model.model_fields) if model else []
        hint = did_you_mean(str(path[-1]), allowed)
        where = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return path, f"unknown key {path[-1]!r}{hint}{where}"
    if kind == "missing":
        info = _field(path)
        said = f": {_clause(info.description)}" if info is not None and info.description else ""
        return path[:-1], f"required key {path[-1]!r} missing{said}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return path, f"expected a mapping{_such_as(path)}, got {describe_value(error['input'])}"
    if kind in ("tuple_type", "list_type"):
        return path, f"expected a list{_such_as(path)}, got {describe_value(error['input'])}"
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
