"""meshconf's own messages as pydantic validation errors, each placed on the key it concerns,
so that a model's cross-field checks read like its field checks (and the loader places them
at a file position the same way)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from meshconf.core.errors import KeyPath


@dataclass(frozen=True)
class FieldError:
    """One problem: where, its kind, the message (``{name}`` filled from ``context``), and the
    value that was given."""

    loc: KeyPath
    kind: str
    message: str
    context: Mapping[str, Any] | None = None
    input: Any = None


def validation_error(title: str, errors: FieldError | list[FieldError]) -> ValidationError:
    """A ``ValidationError`` of the model ``title`` holding ``errors`` (one, or a list)."""
    listed = [errors] if isinstance(errors, FieldError) else errors
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError(
                    error.kind,
                    error.message,
                    None if error.context is None else dict(error.context),
                ),
                loc=error.loc,
                input=error.input,
            )
            for error in listed
        ],
    )
