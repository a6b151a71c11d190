"""Which signals a flow accepts, from whom, and with which payload: checked before anything is stored.

A signal resumes a waiting flow, so what it carries decides money: a ``notification`` says the gateway
took (or refused) a payment, a ``3ds_result`` finishes a card payment. :meth:`Engine.signal` calls
:func:`admit` first, and every caller (the HTTP API, the CLI, Python) gets the same answer:

* the flow's kind must wait for that name somewhere (its ``WaitStep``s list the names it takes);
* ``notification`` comes only from the notification receiver (``by="notification"``), which checked the
  gateway's security token: from anyone else it would let a person mark an unpaid flow paid;
* the payload must fit the signal's model, read strictly (``gateway._strict``): a ``3ds_result``
  without its ``threeDSAuthResponse`` would end the payment failed and erase the card.

A name with no rule here (a test flow's own signal) takes any JSON object from anyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from durapay.gateway import StrictModel, closest, error_field, known_names, validate_strict
from durapay.workflows.engine.steps import FlowDefinition, WaitStep

#: The ``by`` of the notification receiver (``service.receiver``), the only sender of ``notification``.
RECEIVER = "notification"


class SignalRefused(ValueError):
    """A signal refused before anything was stored: ``field`` says which part, ``reason`` why."""

    def __init__(self, name: str, field: str, reason: str) -> None:
        super().__init__(f"signal {name}: {field}: {reason}")
        self.name = name
        self.field = field
        self.reason = reason


def _one_answer(schema: dict[str, Any]) -> None:
    """The document of a 3ds_result: exactly one of the two names, a non-empty string (never null)."""
    for name in ("threeDSAuthResponse", "PaRes"):
        description = schema["properties"][name].get("description", "")
        schema["properties"][name] = {"type": "string", "minLength": 1, "description": description}
    schema["oneOf"] = [{"required": ["threeDSAuthResponse"]}, {"required": ["PaRes"]}]


class ThreeDSResult(StrictModel):
    """``3ds_result``: what the issuer's page posted back to the merchant after the 3DS challenge: its
    answer, as ``threeDSAuthResponse`` or (3DS 1's name) ``PaRes``, exactly one of them; and, as the page
    returned it, ``paymentId`` (the challenged operation's id)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema: _one_answer(schema))

    threeDSAuthResponse: str | None = Field(default=None, description="the challenge's answer")
    PaRes: str | None = Field(default=None, description="the same under its 3DS 1 name")
    paymentId: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the operation the challenge was for, as the issuer's page returned it (recommended: a "
        "result for another challenge of the flow is then dropped, not taken as this one's)",
    )

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not set(data) - known_names(cls):  # unknown fields: StrictModel says
            given = [name for name in ("threeDSAuthResponse", "PaRes") if name in data]
            if len(given) == 1 and data[given[0]] in (None, ""):
                raise ValueError(f"{given[0]}: must be a non-empty string")
            if len(given) != 1:
                raise ValueError("threeDSAuthResponse: give the challenge's answer as threeDSAuthResponse (or PaRes), once")
        return data


class FormCompleted(StrictModel):
    """``form_completed``: the merchant's page saw the embedded form finish; it carries nothing, since
    nothing the page says proves a payment (the flow asks the gateway)."""


@dataclass(frozen=True)
class SignalRule:
    payload: type[BaseModel] | None
    senders: frozenset[str] | None
    description: str

    @property
    def payload_required(self) -> bool:
        """True when no payload (an empty object) is not enough."""
        if self.payload is None:
            return False
        try:
            self.payload.model_validate({})
        except ValidationError:
            return True
        return False


class LinkChanged(StrictModel):
    """``link_changed``: the flow's link was renewed or modified (durapay's ``paybylink_renew`` and
    ``paybylink_modify`` send it): it carries nothing, the flow reads the link from the gateway."""

    model_config = ConfigDict(extra="forbid")


RULES: dict[str, SignalRule] = {
    "3ds_result": SignalRule(ThreeDSResult, None, "the 3DS challenge's answer (three_steps)"),
    "form_completed": SignalRule(FormCompleted, None, "the embedded form finished (build)"),
    "link_changed": SignalRule(
        LinkChanged, None, "a pay-by-link was renewed or modified: the flow reads it again (paybylink; it proves nothing)"
    ),
    "notification": SignalRule(
        None, frozenset({RECEIVER}), "a gateway notification: only through the receiver, which checks its security token"
    ),
}


def accepted(definition: FlowDefinition) -> tuple[str, ...]:
    """The signal names a flow of this kind waits for somewhere, in step order."""
    names: list[str] = []
    for step in definition.steps:
        if isinstance(step, WaitStep):
            names.extend(name for name in step.signals if name not in names)
    return tuple(names)


def open_to(definition: FlowDefinition, by: str) -> tuple[str, ...]:
    """The names ``by`` may send to a flow of this kind."""
    return tuple(name for name in accepted(definition) if may_send(name, by))


def may_send(name: str, by: str) -> bool:
    rule = RULES.get(name)
    return rule is None or rule.senders is None or by in rule.senders


def admit(definition: FlowDefinition | None, name: str, payload: Mapping[str, Any] | None, *, by: str) -> dict[str, Any]:
    """The payload to store, or SignalRefused naming the field and the reason.

    ``definition`` None (a kind this release does not run) is left to the store, as before.
    """
    data = {} if payload is None else payload
    if not isinstance(data, Mapping):
        raise SignalRefused(name, "(body)", "the payload must be a JSON object")
    if definition is None or (name == "notification" and by == RECEIVER):
        # The receiver checked the gateway's token: its word is kept as before, whatever the kind (a
        # refusal here would only make the gateway send it again and again).
        return dict(data)
    names = accepted(definition)
    if name not in names:
        allowed = open_to(definition, by)
        guess = closest(name, allowed)
        hint = f" (did you mean `{guess}`?)" if guess else ""
        known = f"it takes: {', '.join(allowed)}" if allowed else f"it waits for no signal that {by} may send"
        raise SignalRefused(name, "name", f"a {definition.kind} flow takes no signal {name!r}{hint}; {known}")
    if not may_send(name, by):
        raise SignalRefused(name, "name", f"{name} signals come only through the notification receiver (token checked)")
    rule = RULES.get(name)
    if rule is not None and rule.payload is not None:
        try:
            validate_strict(rule.payload, dict(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = error_field(first) or "(body)"
            reason = str(first["msg"]).removeprefix("Value error, ")
            if field == "(body)" and ": " in reason:  # a model-level check names its field first
                field, reason = reason.split(": ", 1)
            raise SignalRefused(name, field, reason) from None
    return dict(data)
