"""Strict reading of merchant input: the gateway's own models, read with ``context=STRICT``.

The gateway models are lenient on purpose (``gateway._base``): a field or a value that a newer gateway
sends must never break reading its answer. What a *merchant* sends is the opposite case: a misspelt
field (``"captureTyp"``) or value (``"EXPLCIT"``) silently dropped or passed on can move money the wrong
way (an immediate sale instead of an authorization). So the same models have a strict mode, selected by
the pydantic validation context, that refuses:

* an unknown field, naming it and the closest known name (``did you mean `captureType`?``);
* an unknown value of a closed set, with the known values;
* an amount out of bounds (``gateway._money``).

Every merchant-facing entry reads its input this way: the HTTP API (flow inputs, schedules, signals),
the CLI, :func:`validate_strict` for Python callers. Nothing else changes between the modes: the
models, their fields and their JSON schema are one.

A field durapay does not model can still reach the gateway, explicitly: ``passThrough`` (see
``gateway._base.PassThrough``).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError, core_schema

#: The validation context key, and the context that selects the strict mode.
STRICT_KEY = "durapay.strict"
STRICT: Mapping[str, Any] = MappingProxyType({STRICT_KEY: True})

#: Error types of the strict mode. An error whose context has ``field`` (a model-level check) names the
#: field below the error's location that it is about (:func:`error_field`).
UNKNOWN_FIELD = "unknown_field"
UNKNOWN_VALUE = "unknown_value"

M = TypeVar("M", bound=BaseModel)


def is_strict(info: ValidationInfo | None) -> bool:
    context = info.context if info is not None else None
    if context is None:  # a lenient read (a stored input, a gateway answer): no ABC check, several per model
        return False
    return bool(isinstance(context, Mapping) and context.get(STRICT_KEY))


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` was most likely meant to be (case-insensitive), or None."""
    candidates = {candidate.lower(): candidate for candidate in known}
    found = difflib.get_close_matches(name.lower(), list(candidates), n=1, cutoff=0.6)
    return candidates[found[0]] if found else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean `captureType`?"`` or nothing."""
    guess = closest(name, known)
    return f"; did you mean `{guess}`?" if guess else ""


def unknown_field(name: str, known: Iterable[str]) -> PydanticCustomError:
    """The error of a field the model does not know; its location gets ``name`` appended."""
    known = sorted(known)
    reason = "unknown field" + did_you_mean(name, known)
    if not reason.endswith("?"):
        reason += f"; known fields: {', '.join(known)}" if known else "; this object takes no fields"
    return PydanticCustomError(UNKNOWN_FIELD, "{reason}", {"reason": reason, "field": name})


def unknown_value(value: str, known: Iterable[str]) -> PydanticCustomError:
    known = list(known)
    reason = f"unknown value {value!r}" + did_you_mean(value, known) + f" (known values: {', '.join(known)})"
    return PydanticCustomError(UNKNOWN_VALUE, "{reason}", {"reason": reason})


@functools.cache
def known_names(model: type[BaseModel]) -> frozenset[str]:
    """Every name a field of ``model`` may be given by (its name and its alias); once per model class."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
        if isinstance(info.validation_alias, str):
            names.add(info.validation_alias)
    return frozenset(names)


def refuse_unknown_fields(model: type[BaseModel], data: Any) -> None:
    """Raise :func:`unknown_field` for the first key of ``data`` that ``model`` does not know."""
    if not isinstance(data, Mapping):
        return
    known = known_names(model)
    for key in data:
        if key not in known:
            raise unknown_field(str(key), known)


def error_field(error: Mapping[str, Any]) -> str:
    """The dotted path of one pydantic error, down to the field a model-level check names (its ``field``)."""
    location = [str(part) for part in error.get("loc", ())]
    named = (error.get("ctx") or {}).get("field")
    if isinstance(named, str) and named:
        location.append(named)
    return ".".join(location)


class StrictModel(BaseModel):
    """A model that is only ever merchant input (a schedule, a signal's payload): always strict about
    its fields, with the same "did you mean" as the gateway models in strict mode."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        refuse_unknown_fields(cls, data)
        return data


class StrictInput:
    """Field metadata that reads the field's model strictly whoever validates it: ``Annotated[MotoRequest,
    StrictInput()]`` in a FastAPI route, which validates bodies without a context of ours. The JSON
    schema stays the model's."""

    def __get_pydantic_core_schema__(self, source: type[BaseModel], handler: Any) -> core_schema.CoreSchema:
        def read(value: Any, _lenient: Any) -> Any:
            return value if isinstance(value, source) else validate_strict(source, value)

        return core_schema.no_info_wrap_validator_function(read, handler(source))


def validate_strict(model: type[M], data: Any) -> M:
    """``data`` read as ``model`` in the strict mode (a ``ValidationError`` names the field)."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json", by_alias=True, exclude_none=True)
    return model.model_validate(data, context=dict(STRICT))
