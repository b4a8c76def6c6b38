"""``--model-file``: a decoder-only transformer described in YAML, read with meshconf's own
reader (positions, YAML 1.2 scalars, no duplicate keys) and validated by a strict pydantic
model whose JSON Schema is committed as ``schemas/meshconf.model.schema.json``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from meshconf.core.errors import ConfigError, Diagnostic, KeyPath, SourceError, describe_value
from meshconf.core.messages import did_you_mean
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
    LatentAttention,
)
from meshconf.model.fields import IntegerBound
from meshconf.sources.files import NotAFileError, TooLargeError, read_limited
from meshconf.sources.yaml_reader import YamlError, decode, read_yaml

#: A model file is a few hundred bytes.
MAX_MODEL_FILE_BYTES = 1 << 16
# Each size is bounded by what a real model reaches, with a margin, so that no count, size
# or time the estimators compute from it overflows.
Layers = Annotated[int, IntegerBound(1, 10_000, "more layers than any model has")]
Width = Annotated[int, IntegerBound(1, 2**22, "wider than any model")]
Vocabulary = Annotated[int, IntegerBound(1, 2**24, "a larger vocabulary than any model has")]
Heads = Annotated[int, IntegerBound(1, 2**14, "more than any model has")]
Rank = Annotated[int, IntegerBound(0, 2**16, "a larger rank than any model uses")]
PositiveRank = Annotated[int, IntegerBound(1, 2**16, "a larger rank than any model uses")]
ExpertCount = Annotated[int, IntegerBound(1, 2**16, "more experts than any model has")]
SharedExperts = Annotated[int, IntegerBound(0, 2**10, "more shared experts than any model has")]
DenseLayers = Annotated[int, IntegerBound(0, 10_000, "more layers than any model has")]
_STRICT = ConfigDict(extra="forbid", strict=True)
#: Error kinds whose messages are meshconf's own, complete with what was given.
_OWN_MESSAGES = frozenset({"integer_type", "integer_range"})


class GroupedQueryAttentionFile(BaseModel):
    """Attention with ``kv_heads`` key/value heads; ``head_dim`` defaults to hidden / heads."""

    model_config = _STRICT
    kind: Literal["grouped_query"] = "grouped_query"
    heads: Heads
    kv_heads: Heads
    head_dim: Heads | None = None
    qk_norm: bool = False

    @model_validator(mode="after")
    def _kv_heads_divide_heads(self) -> GroupedQueryAttentionFile:
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        return self


class LatentAttentionFile(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3); ``q_lora_rank`` 0 projects queries
    directly."""

    model_config = _STRICT
    kind: Literal["latent"]
    heads: Heads
    q_lora_rank: Rank
    kv_lora_rank: PositiveRank
    qk_nope_head_dim: Heads
    qk_rope_head_dim: Heads
    v_head_dim: Heads


class ExpertsFile(BaseModel):
    """A mixture of experts in every layer from ``dense_layers`` on."""

    model_config = _STRICT
    routed: ExpertCount
    top_k: ExpertCount
    ffn: Width
    shared: SharedExperts = 0
    dense_layers: DenseLayers = 0

    @model_validator(mode="after")
    def _top_k_within_routed(self) -> ExpertsFile:
        if self.top_k > self.routed:
            raise ValueError(f"top_k ({self.top_k}) is more than routed ({self.routed})")
        return self


def _attention_kind(value: Any) -> str | None:
    """``kind`` picks the attention model; without it, grouped-query attention."""
    if isinstance(value, dict):
        kind = value.get("kind", "grouped_query")
        return kind if kind in ("grouped_query", "latent") else None
    if isinstance(value, BaseModel):
        return str(getattr(value, "kind", None))
    return None


class ModelFile(BaseModel):
    """A decoder-only transformer for ``meshconf plan --model-file``."""

    model_config = ConfigDict(extra="forbid", strict=True, title="meshconf model")
    name: str = Field(min_length=1, max_length=64)
    layers: Layers
    hidden: Width
    ffn: Width = Field(description="width of the dense feed-forward layers")
    vocab: Vocabulary
    attention: Annotated[
        Annotated[GroupedQueryAttentionFile, Tag("grouped_query")]
        | Annotated[LatentAttentionFile, Tag("latent")],
        Discriminator(_attention_kind),
    ]
    experts: ExpertsFile | None = None
    tied_embeddings: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ModelFile:
        attention = self.attention
        if (
            isinstance(attention, GroupedQueryAttentionFile)
            and attention.head_dim is None
            and self.hidden % attention.heads
        ):
            raise ValueError(
                f"attention.heads ({attention.heads}) does not divide hidden ({self.hidden}); "
                "give attention.head_dim"
            )
        if self.experts is not None and self.experts.dense_layers > self.layers:
            raise ValueError(
                f"experts.dense_layers ({self.experts.dense_layers}) is more than layers "
                f"({self.layers})"
            )
        return self

    def architecture(self) -> Architecture:
        """The validated description as the estimators' :class:`Architecture`."""
        attention = self.attention
        if isinstance(attention, GroupedQueryAttentionFile):
            head_dim = attention.head_dim or self.hidden // attention.heads
            built: GroupedQueryAttention | LatentAttention = GroupedQueryAttention(
                attention.heads, attention.kv_heads, head_dim, attention.qk_norm
            )
        else:
            built = LatentAttention(**attention.model_dump(exclude={"kind"}))
        experts = None if self.experts is None else Experts(**self.experts.model_dump())
        # the other fields are the Architecture's, under the same names
        sizes = self.model_dump(exclude={"attention", "experts"})
        return Architecture(attention=built, experts=experts, **sizes)


def load_model_file(path: str) -> Architecture:
    """Read and validate a model file.

    Raises :class:`SourceError` when the file cannot be read and :class:`ConfigError`, one
    located diagnostic per problem, when it is not a valid model (too large to be one
    included)."""
    try:
        raw = read_limited(path, MAX_MODEL_FILE_BYTES, "model file")
    except NotAFileError as error:
        raise SourceError(f"{path}: {error}") from None
    except TooLargeError as error:
        # an invalid file, as a config too large is: exit 1, not a usage error
        raise ConfigError(
            [
                Diagnostic(
                    (),
                    f"{error.size} bytes, more than the {MAX_MODEL_FILE_BYTES:,} a model file "
                    "may have; this is not a model file",
                    path,
                )
            ]
        ) from None
    except OSError as error:
        raise SourceError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        document = read_yaml(decode(raw))
    except YamlError as error:
        where = error.position
        line, column = (where.line, where.column) if where else (None, None)
        raise ConfigError([Diagnostic(error.path, error.message, path, line, column)]) from None
    if not isinstance(document.data, dict):
        what = "empty" if document.data is None else describe_value(document.data)
        raise ConfigError([Diagnostic((), f"expected a mapping of model keys; got {what}", path)])
    try:
        return ModelFile.model_validate(document.data).architecture()
    except ValidationError as error:
        diagnostics = []
        for item in error.errors(include_url=False):
            located = _located(tuple(item["loc"]), document.positions)
            where = document.positions.get(located)
            line, column = (where.line, where.column) if where else (None, None)
            diagnostics.append(Diagnostic(located, _message(item), path, line, column))
        diagnostics.sort(key=lambda found: (found.line or 0, found.column or 0))
        raise ConfigError(diagnostics) from None


def model_schema_text() -> str:
    """The JSON Schema of a model file, as committed."""
    return json.dumps(ModelFile.model_json_schema(), indent=2) + "\n"


def _located(loc: KeyPath, positions: dict[KeyPath, Any]) -> KeyPath:
    """The key path of a problem as written: without pydantic's union tags, cut back to the
    deepest key the file has."""
    path = tuple(part for part in loc if part not in ("grouped_query", "latent"))
    while path and path not in positions:
        path = path[:-1]
    return path


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model that reads the mapping at ``loc``: the file, its attention (of the kind its
    tag in ``loc`` names) or its experts."""
    if not loc:
        return ModelFile
    if loc[0] == "experts":
        return ExpertsFile
    return LatentAttentionFile if "latent" in loc else GroupedQueryAttentionFile


def _message(item: Any) -> str:
    kind = item["type"]
    loc = tuple(item["loc"])
    if kind == "extra_forbidden":
        allowed = list(_model_at(loc[:-1]).model_fields)
        return (
            f"unknown key {loc[-1]!r}{did_you_mean(str(loc[-1]), allowed)}; allowed: "
            f"{', '.join(allowed)}"
        )
    if kind == "missing":
        return f"required key {loc[-1]!r} missing"
    if kind == "union_tag_invalid":
        kind_given = describe_value(item["input"].get("kind"))
        return f"kind must be grouped_query or latent, got {kind_given}"
    text = str(item["msg"]).removeprefix("Value error, ")
    if kind in _OWN_MESSAGES:
        return text
    if kind.endswith("_type") or kind.startswith(("greater_than", "string_")):
        text += f", got {describe_value(item['input'])}"
    return text
