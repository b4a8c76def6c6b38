"""Value types of the config fields, each with a message written for people.

``expected an integer >= 1, got the string '010' (a leading zero: ...)`` rather than pydantic's
generic text: the loader keeps YAML 1.1 look-alikes as strings, and these validators say why
they are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler, WithJsonSchema
from pydantic_core import PydanticCustomError, core_schema

from meshconf.core.degrees import AUTO, MAX_WORLD_SIZE, WORLD_FACTORS
from meshconf.core.domains import MAX_NAME_LENGTH, NAME_PATTERN
from meshconf.core.errors import describe_value
from meshconf.core.formulas import MAX_LITERAL_DIGITS

# Strings that PyYAML's YAML 1.1 resolver would have turned into numbers or booleans; the
# loader keeps them as strings so that they can be refused here with the reason.
_YAML11_TRAPS = (
    (
        re.compile(r"[-+]?0[0-9_]+"),
        "a leading zero: YAML 1.1 reads it as octal, YAML 1.2 as decimal",
    ),
    (re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+"), "YAML 1.1 reads it as a base-60 number"),
    (re.compile(r"[-+]?[0-9][0-9_]*_[0-9_]*"), "YAML 1.1 reads '_' in numbers as nothing"),
    (re.compile(r"[-+]?0b[01_]+"), "YAML 1.1 reads it as a binary number"),
    (re.compile(r"[-+]?[0-9]+"), "a quoted number is a string"),
    (re.compile(r"(?i:y|yes|n|no|on|off)"), "YAML 1.1 reads it as a boolean"),
)
MAX_GPUS_PER_NODE = 4096


def _yaml_trap_hint(value: Any) -> str:
    if isinstance(value, str):
        for pattern, reason in _YAML11_TRAPS:
            if pattern.fullmatch(value):
                return f" ({reason}; write the integer you mean, unquoted)"
    return ""


def _integer(
    value: Any,
    *,
    minimum: int,
    auto: bool,
    maximum: int = MAX_WORLD_SIZE,
    limit: str = "the most ranks torch can number",
) -> int:
    expected = f"an integer >= {minimum}" + (" or -1 (fill the remaining ranks)" if auto else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            "integer_type",
            "expected {expected}, got {got}{hint}",
            {"expected": expected, "got": describe_value(value), "hint": _yaml_trap_hint(value)},
        )
    if auto and value == AUTO:
        return value
    # Huge integers are named by their digits: pydantic formats the context as text, and
    # Python refuses to write an integer of more than 4,300 digits.
    shown = str(value) if value.bit_length() <= 100 else describe_value(value)
    if value < minimum:
        raise PydanticCustomError(
            "integer_range",
            "expected {expected}, got {value}",
            {"expected": expected, "value": shown},
        )
    if value > maximum:
        raise PydanticCustomError(
            "integer_range",
            "{value} is larger than {maximum}, {limit}",
            {"value": shown, "maximum": maximum, "limit": limit},
        )
    return value


@dataclass(frozen=True)
class IntegerBound:
    """``Annotated[int, IntegerBound(1, 10_000, "more layers than any model has")]``: an
    integer from ``minimum`` to ``maximum`` with meshconf's messages and JSON Schema;
    ``beyond`` says what a larger value would be."""

    minimum: int
    maximum: int
    beyond: str

    def check(self, value: Any) -> int:
        return _integer(
            value, minimum=self.minimum, auto=False, maximum=self.maximum, limit=self.beyond
        )

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


def _world_factor(value: Any) -> int:
    return _integer(value, minimum=1, auto=True)


def _expert_degree(value: Any) -> int:
    if value == AUTO and not isinstance(value, bool):
        raise PydanticCustomError(
            "integer_range",
            "expected an integer >= 1, got -1: only the world factors ({factors}) may be -1; "
            "expert degrees borrow their ranks from dp_shard * cp * tp",
            {"factors": ", ".join(WORLD_FACTORS)},
        )
    return _integer(value, minimum=1, auto=False)


def device_value(value: Any) -> Any:
    """Case slips and ``gpu`` (which difflib would send to ``cpu``) get a pointed hint."""
    if not isinstance(value, str):
        return value
    meant = {"gpu": "cuda", "gpus": "cuda", "nvidia": "cuda"}.get(value.lower(), value.lower())
    if meant != value and meant in ("auto", "cuda", "cpu"):
        raise PydanticCustomError(
            "device_value",
            "expected 'auto', 'cuda' or 'cpu', got {got} (did you mean '{meant}'?)",
            {"got": describe_value(value), "meant": meant},
        )
    return value


#: Per GPU; NVLink 5 gives 900 GB/s each way, so this is far past any link built.
MAX_BANDWIDTH_GB_S = 100_000
#: The slowest link a level may have, GB/s per GPU: a dial-up line is a thousand times faster
#: than anything below it; slower, the estimate's seconds would overflow.
MIN_BANDWIDTH_GB_S = 0.01


def _bandwidth(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(
            "bandwidth_type",
            "expected a bandwidth in GB/s per GPU such as 900 or 50, got {got}{hint}",
            {"got": describe_value(value), "hint": _yaml_trap_hint(value)},
        )
    if not MIN_BANDWIDTH_GB_S <= value <= MAX_BANDWIDTH_GB_S:  # also refuses nan
        raise PydanticCustomError(
            "bandwidth_range",
            "expected a bandwidth from {minimum} to {maximum} GB/s per GPU, got {value}",
            {
                "minimum": MIN_BANDWIDTH_GB_S,
                "maximum": MAX_BANDWIDTH_GB_S,
                "value": describe_value(value),
            },
        )
    return float(value)


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError(
            "name_type", "expected a name, got {got}", {"got": describe_value(value)}
        )
    if len(value) > MAX_NAME_LENGTH:
        raise PydanticCustomError(
            "name_length",
            "'{value}...' is longer than {limit} characters; give a shorter name",
            {"value": value[:20], "limit": MAX_NAME_LENGTH},
        )
    if not NAME_PATTERN.fullmatch(value):
        raise PydanticCustomError(
            "name_pattern",
            "'{value}' is not a valid name: use letters, digits and '_', not starting with a digit",
            {"value": value[:MAX_NAME_LENGTH]},
        )
    return value


def _formula_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PydanticCustomError(
            "formula_type",
            "expected a formula such as 'dp_shard * cp', got {got}",
            {"got": describe_value(value)},
        )
    # An integer is a formula of one literal; one too long to write out as text (Python
    # refuses past 4,300 digits) is longer than any literal a formula takes.
    if isinstance(value, int) and value.bit_length() > 4 * MAX_LITERAL_DIGITS:
        raise PydanticCustomError(
            "formula_literal",
            "{got} is larger than a formula's integers, of at most {digits} digits",
            {"got": describe_value(value), "digits": MAX_LITERAL_DIGITS},
        )
    return str(value)


def _dim_list(value: Any) -> Any:
    if isinstance(value, str):
        raise PydanticCustomError(
            "dims_type",
            "expected a list of dim names, outer to inner, such as [pp, fsdp, tp], got {got}",
            {"got": describe_value(value)},
        )
    return value


#: Levels a config may list: a node, an NVLink domain, a pod, a building, with room to spare.
MAX_LEVELS = 16


def level_list(value: Any) -> Any:
    """A list of levels, no longer than :data:`MAX_LEVELS`; the items are checked after."""
    if not isinstance(value, list | tuple):
        raise PydanticCustomError(
            "levels_type",
            "expected a list of levels, inner to outer, such as [{name: node, size: 4}, "
            "{name: nvlink, size: 72}], got {got}",
            {"got": describe_value(value)},
        )
    if len(value) > MAX_LEVELS:
        raise PydanticCustomError(
            "levels_length",
            "{count} levels are more than {limit}, more than any cluster is built of; give "
            "at most {limit}",
            {"count": len(value), "limit": MAX_LEVELS},
        )
    return value


def _order_list(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise PydanticCustomError(
            "order_type",
            "expected a list of the world factors, outer to inner, such as "
            "[dp_replicate, dp_shard, pp, cp, tp], got {got}",
            {"got": describe_value(value)},
        )
    return value


# JSON Schema for each type (``meshconf schema``). It states the type and range; YAML 1.1
# look-alikes and formulas are left to ``meshconf validate``.
_AUTO_SCHEMA = {"const": AUTO, "description": "Fill the ranks the other degrees leave."}
_NAME_SCHEMA = {
    "title": "name",
    "type": "string",
    "pattern": f"^{NAME_PATTERN.pattern}$",
    "maxLength": MAX_NAME_LENGTH,
}
# What a formula may contain: names, integers, '*', '/', parentheses and spaces.
_FORMULA_CHARACTERS = r"^[A-Za-z0-9_*/() \t]+$"

_RANKS = {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE}
WorldFactor = Annotated[
    int, BeforeValidator(_world_factor), WithJsonSchema({"anyOf": [_RANKS, _AUTO_SCHEMA]})
]
Positive = Annotated[int, IntegerBound(1, MAX_WORLD_SIZE, "the most ranks torch can number")]
ExpertDegree = Annotated[int, BeforeValidator(_expert_degree), WithJsonSchema(_RANKS)]
GpusPerNode = Annotated[int, IntegerBound(1, MAX_GPUS_PER_NODE, "more than any node holds")]
TimeoutSeconds = Annotated[int, IntegerBound(1, MAX_WORLD_SIZE, "longer than any job should wait")]
Name = Annotated[str, BeforeValidator(_name), WithJsonSchema(_NAME_SCHEMA)]
BandwidthGBs = Annotated[
    float,
    BeforeValidator(_bandwidth),
    WithJsonSchema(
        {"type": "number", "minimum": MIN_BANDWIDTH_GB_S, "maximum": MAX_BANDWIDTH_GB_S}
    ),
]
FormulaText = Annotated[
    str,
    BeforeValidator(_formula_text),
    WithJsonSchema(
        {
            "anyOf": [
                {"title": "formula", "type": "string", "pattern": _FORMULA_CHARACTERS},
                {"type": "integer", "minimum": 1},
            ]
        }
    ),
]
DimList = Annotated[
    tuple[Name, ...],
    BeforeValidator(_dim_list),
    WithJsonSchema({"type": "array", "items": _NAME_SCHEMA, "minItems": 1, "uniqueItems": True}),
]
WorldOrder = Annotated[
    tuple[Name, ...],
    BeforeValidator(_order_list),
    WithJsonSchema(
        {
            "type": "array",
            "items": {"enum": list(WORLD_FACTORS)},
            "minItems": len(WORLD_FACTORS),
            "maxItems": len(WORLD_FACTORS),
            "uniqueItems": True,
        }
    ),
]
