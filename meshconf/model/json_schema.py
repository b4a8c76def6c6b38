"""JSON Schema of the configuration, generated from the models (``meshconf schema``).

pydantic derives types, ranges, defaults, descriptions and examples from the fields. This
module adds what pydantic cannot see in the models but JSON Schema can still say (at most one
``-1`` degree, no ``nccl`` on ``cpu``, derived names that are not degree names), inlines the
nested models so that editors show their documentation in place, and writes a variant for
Hydra config groups. Formulas are left to ``meshconf validate``.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Literal

from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from meshconf.core.degrees import AUTO, DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.errors import InvalidArgumentError
from meshconf.model.config import MeshConfig
from meshconf.model.fields import MAX_LEVELS

Flavor = Literal["plain", "hydra"]
FLAVORS: tuple[Flavor, ...] = ("plain", "hydra")

#: Editors support draft-07 best; the schema uses nothing that 2020-12 reads differently.
DIALECT = "http://json-schema.org/draft-07/schema#"

_DESCRIPTION = (
    "A meshconf mesh configuration: world size, parallel degrees, derived dims and domains. "
    "This schema checks keys, types and ranges. The formulas (the world product, expert "
    "borrowing, derived dims, each domain's product and the same rank groups for a dim in "
    "every domain) are checked by `meshconf validate`, not by this schema."
)
_HYDRA_DESCRIPTION = (
    " This variant is for Hydra config groups: every value may also be an OmegaConf "
    "interpolation (${...}) or ??? (mandatory), and `defaults` and `_target_` are allowed."
)
_INTERPOLATION = {
    "type": "string",
    "pattern": r"^\?\?\?$|\$\{",
    "description": "An OmegaConf interpolation such as ${oc.env:WORLD_SIZE}, or ??? (mandatory).",
}
# Keys an editor shows next to a value; kept on the outside when a value is wrapped.
_DOCUMENTATION = ("title", "description", "default", "examples")


class _Generator(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def dict_schema(self, schema: core_schema.DictSchema) -> dict[str, Any]:
        # pydantic turns a key pattern into patternProperties, which lets keys that miss the
        # pattern through unchecked; propertyNames refuses them.
        result = super().dict_schema(schema)
        patterns = result.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            result["propertyNames"] = {**result.get("propertyNames", {}), "pattern": pattern}
            result["additionalProperties"] = values
        return result


def build_schema(flavor: Flavor = "plain") -> dict[str, Any]:
    """The JSON Schema of a meshconf config, or of a Hydra config-group option."""
    if flavor not in FLAVORS:
        raise InvalidArgumentError(
            f"unknown schema flavor {flavor!r}; flavors: {', '.join(FLAVORS)}"
        )
    generated = MeshConfig.model_json_schema(schema_generator=_Generator)
    definitions = generated.pop("$defs")
    properties = generated["properties"]
    for name in ("degrees", "runtime"):
        properties[name] = _inline(properties[name], definitions)
    for name in ("inside_node", "training"):
        properties[name] = _inline_optional(properties[name], definitions)
    levels = properties["levels"]["anyOf"][0]
    levels["items"] = _inline(levels["items"], definitions)
    levels["maxItems"] = MAX_LEVELS
    _add_cross_field_rules(properties)
    schema = {
        "$schema": DIALECT,
        "title": "meshconf configuration",
        "description": _DESCRIPTION,
        **{key: value for key, value in generated.items() if key not in ("title", "description")},
    }
    if flavor == "hydra":
        schema = _hydra_variant(schema)
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _inline(reference: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    name = reference["$ref"].rsplit("/", 1)[-1]
    model = dict(definitions[name])
    model.pop("title", None)
    documentation = {key: value for key, value in reference.items() if key != "$ref"}
    return {
        **documentation,
        **{key: value for key, value in model.items() if key not in documentation},
    }


def _inline_optional(field: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """An optional nested model (``anyOf: [$ref, null]``), inlined as a mapping or null."""
    reference, _ = field["anyOf"]
    documentation = {key: value for key, value in field.items() if key != "anyOf"}
    inlined = _inline({**reference, **documentation}, definitions)
    return {**inlined, "type": ["object", "null"]}


def _add_cross_field_rules(properties: dict[str, Any]) -> None:
    properties["degrees"]["not"] = {
        "description": "At most one world factor may be -1.",
        "anyOf": [
            {"required": list(pair), "properties": {name: {"const": AUTO} for name in pair}}
            for pair in itertools.combinations(WORLD_FACTORS, 2)
        ],
    }
    properties["runtime"]["not"] = {
        "description": "nccl needs device cuda (or auto).",
        "required": ["device", "backend"],
        "properties": {"device": {"const": "cpu"}, "backend": {"const": "nccl"}},
    }
    derived_names = properties["derived"]["propertyNames"]
    derived_names["not"] = {
        "description": "A derived dim needs a name of its own, not a degree's.",
        "enum": list(DEGREE_NAMES),
    }
    properties["domains"]["anyOf"][0]["minProperties"] = 1


def _hydra_variant(schema: dict[str, Any]) -> dict[str, Any]:
    hydra = _accept_interpolation(schema)
    hydra["description"] = schema["description"] + _HYDRA_DESCRIPTION
    hydra["properties"] = {
        "defaults": {
            "description": "Hydra's defaults list, such as [_meshconf_schema, _self_].",
            "type": "array",
            "items": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "object", "minProperties": 1, "maxProperties": 1},
                ]
            },
            "examples": [["_meshconf_schema", "_self_"]],
        },
        "_target_": {
            "description": "What hydra.utils.instantiate calls; meshconf's returns a MeshConfig.",
            "type": "string",
            "examples": ["meshconf.integrations.hydra.build_config"],
        },
        **hydra["properties"],
    }
    return hydra


def _accept_interpolation(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every value below it also allowed to be an interpolation."""
    result = dict(schema)
    if "properties" in result:
        result["properties"] = {name: _wrap(value) for name, value in result["properties"].items()}
    if isinstance(result.get("additionalProperties"), dict):
        result["additionalProperties"] = _wrap(result["additionalProperties"])
    if "items" in result:
        result["items"] = _wrap(result["items"])
    if "anyOf" in result:
        result["anyOf"] = [_accept_interpolation(option) for option in result["anyOf"]]
    return result


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    documentation = {key: schema[key] for key in _DOCUMENTATION if key in schema}
    value = {key: item for key, item in schema.items() if key not in _DOCUMENTATION}
    return {**documentation, "anyOf": [_accept_interpolation(value), _INTERPOLATION]}
