"""Base model and lenient enums: a new gateway field or value never breaks a caller.

Two rules from the house style meet here:

* Unknown *fields* are accepted and kept (``extra="allow"``): they round-trip through
  ``model_dump`` and are readable as ``model.model_extra``.
* Unknown *values* of a closed set are accepted but never passed off as known: a field annotated
  with :class:`LenientEnum` holds either a member of the enum or an :class:`Unknown` (a ``str`` subclass), so
  ``value is OperationResult.AUTHORIZED`` stays exact and ``isinstance(value, Unknown)`` says the
  gateway sent something this version does not understand.

Merchant input is read from the same models in a strict mode (``gateway._strict``): unknown fields and
unknown values are refused there, amounts bounded. :class:`PassThrough` is the one explicit way to send
the gateway a field durapay does not model.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationInfo, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from durapay.gateway._money import bounded_amounts, check_amount
from durapay.gateway._strict import is_strict, known_names, refuse_unknown_fields, unknown_value


class GatewayModel(BaseModel):
    """Every request and response body: the gateway's own field names, unknown fields kept.

    Read with ``context=STRICT`` (merchant input), unknown fields are refused instead, and every amount
    is checked against the bound of the model's ``currency`` when it has one.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, use_enum_values=False)

    #: True for a body whose fields durapay does not model (:class:`AnyObject`): kept even when strict.
    open_fields: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _strict_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not cls.open_fields and is_strict(info):
            refuse_unknown_fields(cls, data)
        return data

    @model_validator(mode="after")
    def _strict_amounts(self, info: ValidationInfo) -> Any:
        """Merchant input: amounts bounded in their currency: the model's own, or for a part that names
        none (a hosted page's ``paymentSession``, a link's installments) the currency its siblings name
        (the ``order``'s): an extra zero there must not escape the bound of the currency it is paid in."""
        if not is_strict(info):
            return self
        currency = getattr(self, "currency", None)
        if isinstance(currency, str):
            _check_amounts(self, currency, "")
            return self
        parts = [(name, getattr(self, name)) for name in type(self).model_fields]
        named = next((part.currency for _, part in parts if isinstance(getattr(part, "currency", None), str)), None)
        if named is None:
            return self
        for name, part in parts:
            for index, item in enumerate(part if isinstance(part, list) else [part]):
                if isinstance(item, GatewayModel) and not isinstance(getattr(item, "currency", None), str):
                    where = f"{name}.{index}." if isinstance(part, list) else f"{name}."
                    _check_amounts(item, named, where)
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """Requests (validation mode) are read strictly: the document says no other field is taken."""
        found = handler(schema)
        if handler.mode == "validation" and not cls.open_fields:
            handler.resolve_ref_schema(found)["additionalProperties"] = False
        return found

    def wire(self) -> dict[str, Any]:
        """The JSON object sent to the gateway: amounts as strings, no ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _check_amounts(model: GatewayModel, currency: str, prefix: str) -> None:
    for name, zero in bounded_amounts(type(model)):
        value = getattr(model, name)
        if value is not None:
            try:
                check_amount(value, currency, zero=zero)
            except ValueError as exc:
                raise PydanticCustomError(
                    "amount_out_of_range", "{reason}", {"reason": str(exc), "field": prefix + name}
                ) from None


class AnyObject(GatewayModel):
    """A body the public material does not describe: any JSON object, every field kept."""

    open_fields: ClassVar[bool] = True


#: The pass-through field's name (docs/api.md: "Fields durapay does not model").
PASS_THROUGH = "passThrough"  # noqa: S105 (a field name, not a password)


class PassThrough(GatewayModel):
    """A merchant input that may carry gateway fields durapay does not model, explicitly.

    Strict reading refuses unknown fields, so a field the gateway takes and durapay does not model is
    sent under ``passThrough``: ``{"order": {...}, "passThrough": {"newGatewayField": "x"}}`` sends
    ``newGatewayField`` at the top of the request body, as it is. It may not name a field durapay models
    (that field is written in its own place, where it is checked).
    """

    passThrough: dict[str, Any] | None = Field(
        default=None,
        description="Gateway request fields durapay does not model, merged as they are into the top of the request "
        "body (never one of the fields above).",
    )

    @model_validator(mode="after")
    def _no_override(self) -> Any:
        if self.passThrough:
            known = known_names(type(self))
            for key in self.passThrough:
                if key in known:
                    raise PydanticCustomError(
                        "pass_through_override",
                        "{reason}",
                        {
                            "reason": f"`{key}` is a field durapay models: write it in its place, not in passThrough",
                            "field": f"{PASS_THROUGH}.{key}",
                        },
                    )
        return self

    def wire(self) -> dict[str, Any]:
        body = super().wire()
        extra = body.pop(PASS_THROUGH, None) or {}
        return {**extra, **body}


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

    def _parse(self, value: Any, info: ValidationInfo) -> Any:
        if value is None or isinstance(value, self.enum):
            return value
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        parsed = parse_lenient(self.enum, value)
        if isinstance(parsed, Unknown) and is_strict(info):
            raise unknown_value(value, [member.value for member in self.enum])
        return parsed

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            self._parse,
            serialization=core_schema.plain_serializer_function_ser_schema(_serialise, when_used="json"),
        )

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        known = [member.value for member in self.enum]
        if handler.mode == "validation":  # what a merchant may send: one of the known values
            return {"type": "string", "enum": known}
        return {"type": "string", "examples": known, "description": f"one of {known}; other values are kept"}


def _serialise(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def is_known(value: object) -> bool:
    """False for ``None`` and for :class:`Unknown` values."""
    return value is not None and not isinstance(value, Unknown)
