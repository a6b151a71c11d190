"""Base model and lenient enums: a new gateway field or value never breaks a caller.

Two rules from the house style meet here:

* Unknown *fields* are accepted and kept (``extra="allow"``): they round-trip through
  ``model_dump`` and are readable as ``model.model_extra``.
* Unknown *values* of a closed set are accepted but never passed off as known: a field annotated
  with :class:`LenientEnum` holds either a member of the enum or an :class:`Unknown` (a ``str`` subclass), so
  ``value is OperationResult.AUTHORIZED`` stays exact and ``isinstance(value, Unknown)`` says the
  gateway sent something this version does not understand.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import core_schema


class GatewayModel(BaseModel):
    """Every request and response body: the gateway's own field names, unknown fields kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, use_enum_values=False)

    def wire(self) -> dict[str, Any]:
        """The JSON object sent to the gateway: amounts as strings, no ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class AnyObject(GatewayModel):
    """A body the public material does not describe: any JSON object, every field kept."""


class Unknown(str):
    """A value of a closed set that this version of durapay does not know. Compare as a string."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Unknown({str.__repr__(self)})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.to_string_ser_schema()
        )


E = TypeVar("E", bound=Enum)


def parse_lenient(enum: type[E], value: Any) -> E | Unknown:
    """The member of ``enum`` whose value is ``value``, else ``Unknown(value)``."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        return Unknown(str(value))


class LenientEnum:
    """Field metadata: ``Annotated[OperationResult | Unknown | None, LenientEnum(OperationResult)]``.

    Known values become members; anything else becomes :class:`Unknown`; JSON gets the plain string.
    """

    def __init__(self, enum: type[Enum]) -> None:
        self.enum = enum

    def _parse(self, value: Any) -> Any:
        if value is None or isinstance(value, (self.enum, Unknown)):
            return value
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        return parse_lenient(self.enum, value)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self._parse,
            serialization=core_schema.plain_serializer_function_ser_schema(_serialise, when_used="json"),
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: Any) -> dict[str, Any]:
        known = [member.value for member in self.enum]
        return {"type": "string", "examples": known, "description": f"one of {known}; other values are kept"}


def _serialise(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def is_known(value: object) -> bool:
    """False for ``None`` and for :class:`Unknown` values."""
    return value is not None and not isinstance(value, Unknown)
