"""The config's ``training`` block: what the estimate of the layout reads. ``meshconf show``,
``measure`` and ``plan`` read it, ``plan --emit`` writes it; the runtime builds the same
meshes whatever it says. Its keys, bounds and choices are rows of :mod:`meshconf.core.settings`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

from pydantic import (
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from meshconf.core.errors import describe_value
from meshconf.core.schedules import (
    DEFAULT_SCHEDULE,
    GROUPED_LISTED,
    LOOPED_LISTED,
    SCHEDULE_BY_NAME,
)
from meshconf.core.setting_values import Bound, TrainingSetting
from meshconf.core.settings import SETTINGS, TRAINING_SETTINGS
from meshconf.model.field_errors import FieldError, validation_error
from meshconf.model.fields import IntegerBound
from meshconf.model.sections import FrozenModel


def _boolean(value: Any) -> bool:
    # true or false only: not pydantic's lax 1 or "yes"
    if not isinstance(value, bool):
        raise PydanticCustomError(
            "bool_type", "expected true or false, got {got}", {"got": describe_value(value)}
        )
    return value


@dataclass(frozen=True)
class _NumberBound:
    """A number (an integer or a decimal) within a training number's bound, with the
    command line's messages."""

    bound: Bound

    def check(self, value: Any) -> float:
        bound = self.bound
        expected = f"expected a number from {bound.minimum:g} to {bound.maximum:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PydanticCustomError(
                "number_type",
                "{expected}, got {got}",
                {"expected": expected, "got": describe_value(value)},
            )
        if math.isfinite(value) and value > bound.maximum:
            raise PydanticCustomError(
                "number_range",
                "{value} is more than {maximum}: {beyond}",
                {"value": f"{value:g}", "maximum": f"{bound.maximum:g}", "beyond": bound.beyond},
            )
        if not bound.minimum <= value <= bound.maximum:  # also refuses nan and infinities
            raise PydanticCustomError(
                "number_range",
                "{expected}, got {value}",
                {"expected": expected, "value": f"{value:g}"},
            )
        return float(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.check)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"type": "number", "minimum": self.bound.minimum, "maximum": self.bound.maximum}


def _model_file(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise PydanticCustomError(
            "path_type",
            "expected the path of a model file, got {got}",
            {"got": describe_value(value)},
        )
    return value


def _field_type(row: TrainingSetting) -> Any:
    """The type of a row's key in the block: its kind, within its bound or choices."""
    if row.bound is not None:
        if row.kind == "number":
            return Annotated[float, _NumberBound(row.bound)]
        minimum, maximum = int(row.bound.minimum), int(row.bound.maximum)
        return Annotated[int, IntegerBound(minimum, maximum, row.bound.beyond)]
    if row.kind == "switch":
        return Annotated[bool, BeforeValidator(_boolean)]
    if row.kind == "path":
        return Annotated[str, BeforeValidator(_model_file)]
    return Literal[row.choices]


# Made from the table of settings, so that a new setting reaches the block without an edit
# here; type checkers see the keys as attributes of any type.
if TYPE_CHECKING:
    _Keys = FrozenModel
else:
    _Keys = create_model(
        "_Keys",
        __base__=FrozenModel,
        **{
            row.key: (
                _field_type(row) | None,
                Field(None, description=row.description, examples=list(row.examples)),
            )
            for row in TRAINING_SETTINGS
        },
    )


class TrainingOptions(_Keys):
    """What the estimate reads: the model, the GPU, the batch and how training uses the
    dims; a key left out takes the estimate's default (docs/plan.md), and a command-line
    option of the same name replaces it."""

    if TYPE_CHECKING:

        def __getattr__(self, key: str) -> Any: ...

    @model_validator(mode="after")
    def _settings_go_together(self, info: ValidationInfo) -> TrainingOptions:
        """Every rule between keys. A message names each key by ``context["name"]`` where
        the validation is given one (the command line names its options), else by itself."""
        name: Callable[[str], str] = (info.context or {}).get("name", str)
        if self.model is not None and self.model_file is not None:
            self._refuse(
                "model_file",
                "model_conflict",
                f"{name('model')} and {name('model_file')} exclude each other: both name the "
                "model estimated",
            )
        if self.fp8_param_gather and self.zero_stage == 0:
            self._refuse(
                "fp8_param_gather",
                "fp8_without_gathers",
                f"{name('fp8_param_gather')} needs {name('zero_stage')} 1, 2 or 3: ZeRO 0 keeps "
                "the parameters whole on every rank and gathers none",
            )
        parts = self._given("cuda_context_gib", "nccl_communicator_gib", "allocator_gib")
        if self.runtime_gib is not None and parts:
            # runtime_gib is the whole term: a part given beside it would be dropped
            self._refuse(
                parts[0],
                "runtime_conflict",
                f"{name('runtime_gib')} and {name(parts[0])} exclude each other: the first "
                "is the whole runtime term, the second one of its parts; give the total or the "
                "parts",
            )
        chosen = self._given("checkpoint_every", "checkpoint_first", "checkpoint_group")
        if len(chosen) > 1:
            self._refuse(
                chosen[-1],
                "recomputation_mismatch",
                f"{name(chosen[0])} and {name(chosen[-1])} exclude each other: both choose the "
                "blocks recomputed",
            )
        if chosen and self.activation_checkpointing not in (None, "full"):
            self._refuse(
                chosen[0],
                "recomputation_mismatch",
                f"{name(chosen[0])} needs {name('activation_checkpointing')} full: only full "
                "checkpointing recomputes whole blocks",
            )
        weights = self._given("embedding_as_layers", "output_as_layers")
        if weights and self._given("first_stage_layers", "last_stage_layers"):
            # Megatron-LM refuses them together too
            self._refuse(
                weights[0],
                "split_conflict",
                f"{name(weights[0])} and {name('first_stage_layers')} or "
                f"{name('last_stage_layers')} exclude each other: both set the layers of the "
                "first and last pipeline chunks",
            )
        schedule = SCHEDULE_BY_NAME[self.pp_schedule or DEFAULT_SCHEDULE]
        schedule_key, stages_key = name("pp_schedule"), name("virtual_stages")
        if self.layers_per_stage is not None and self.virtual_stages is not None:
            self._refuse(
                "virtual_stages",
                "schedule_stages",
                f"{stages_key} and {name('layers_per_stage')} exclude each other: both set the "
                "model chunks per pipeline rank",
            )
        if self.layers_per_stage is None and schedule.looped and (self.virtual_stages or 0) < 2:
            self._refuse(
                "virtual_stages",
                "schedule_stages",
                f"{schedule_key} {self.pp_schedule} needs {stages_key} >= 2",
            )
        if not schedule.looped and self.virtual_stages not in (None, 1):
            self._refuse(
                "virtual_stages",
                "schedule_stages",
                f"{stages_key} needs {schedule_key} {LOOPED_LISTED}",
            )
        if self.microbatch_group is not None and schedule.grouping is None:
            self._refuse(
                "microbatch_group",
                "schedule_group",
                f"{name('microbatch_group')} needs {schedule_key} {GROUPED_LISTED}: no other "
                "schedule groups the micro-batches of a model chunk",
            )
        return self

    def _given(self, *keys: str) -> list[str]:
        return [key for key in keys if getattr(self, key) is not None]

    def _refuse(self, key: str, code: str, message: str) -> NoReturn:
        """Refuse the block at ``key``, which does not go with the keys before it."""
        raise validation_error(
            "TrainingOptions", [FieldError((key,), code, message, input=getattr(self, key))]
        )

    def estimate_settings(self) -> dict[str, Any]:
        """The keys set, by the estimate's setting names (``pp_schedule`` is ``schedule``):
        ``model`` or ``model_file`` name the model, the others are settings of the estimate."""
        return {
            SETTINGS[key].attribute: value
            for key, value in self.model_dump().items()
            if value is not None
        }


def refusal(settings: Mapping[str, Any], name: Callable[[str], str]) -> str | None:
    """Why ``settings`` (by key, each within its bound or choices) do not go together, each
    key named by ``name`` (an option, or the key and where a file gives it); None if they do."""
    try:
        TrainingOptions.model_validate(settings, context={"name": name})
    except ValidationError as error:
        return str(error.errors()[0]["msg"])
    return None
