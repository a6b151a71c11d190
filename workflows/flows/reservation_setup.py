"""Reservation guarantee set-up: the ``reservation_setup`` flow.

It runs the set-up calls of the area in this order, one step per section, each only when the input
gives it: the service switch (``DISPUTELESS`` on a terminal), terms and conditions, structures,
agencies, structure conditions, agency conditions, custom fields. ``form`` selects the path forms as for
the other reservation flows (``earlier`` creates custom fields at ``/custom_fields`` and has no agency
endpoints, so agency sections are refused with it).

Set-up is safe to run again: structures and agencies are looked up by their id, terms and conditions
(current form, the only one that lists them) and conditions by name, and only what is missing is
created. Custom fields and earlier-form terms cannot be looked up: a section repeated after an
ambiguous failure may create a second copy of those (a harmless extra set-up object, never a charge).
The outcome lists every id, created or found.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationInfo, field_validator

from durapay.flows import Call, Flow, call
from durapay.gateway import (
    Agency,
    AgencyConditionRequest,
    Catalogue,
    CustomFieldRequest,
    GatewayModel,
    NotFound,
    ServiceRequest,
    Structure,
    StructureConditionRequest,
    TermsAndConditionsRequest,
)
from durapay.tasks.outcomes import Advance, Outcome
from durapay.tasks.runner import StepContext
from durapay.workflows.engine import CallStep
from durapay.workflows.flows.reservations import Form


class SetupInput(GatewayModel):
    """What to set up; every section is optional, and runs as one step in this order."""

    form: Form = "current"
    service: ServiceRequest | None = None
    termsAndConditions: list[TermsAndConditionsRequest] = []
    structures: list[Structure] = []
    agencies: list[Agency] = []
    structureConditions: list[StructureConditionRequest] = []
    agencyConditions: list[AgencyConditionRequest] = []
    customFields: list[CustomFieldRequest] = []

    @field_validator("agencies", "agencyConditions", "customFields")
    @classmethod
    def _no_agencies_in_earlier_form(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        agency_items = [item for item in value if not isinstance(item, CustomFieldRequest) or item.agencyId]
        if info.data.get("form") == "earlier" and agency_items:
            raise ValueError("the earlier path forms have no agency endpoints; use form current")
        return value


def _service(ctx: StepContext) -> Outcome:
    ctx.call(Catalogue.set_reservation_service, request=ctx.input.service)
    return Advance({"service": ctx.input.service.wire()})


def _terms(ctx: StepContext) -> Outcome:
    existing: dict[str, str] = {}
    if ctx.input.form == "current":  # only the current form lists terms and conditions
        listing = ctx.call(Catalogue.list_terms_and_conditions)
        existing = {t.name: t.termsAndConditionsId for t in listing.termsAndConditions if t.name and t.status != "CANCELED"}
    ids = []
    for item in ctx.input.termsAndConditions:
        if item.name not in existing:
            existing[item.name] = ctx.call(Catalogue.create_terms_and_conditions, request=item).termsAndConditionsId
        ids.append(existing[item.name])
    return Advance({"termsAndConditionsIds": ids})


def _owners(ctx: StepContext, items: list[Any], id_field: str, get: Any, create: Any, wrap: str) -> list[str]:
    """Structures or agencies: created unless one with the same id exists."""
    ids = []
    for item in items:
        owner_id = getattr(item, id_field)
        try:
            ctx.call(get, owner_id)
        except NotFound:
            ctx.call(create, request={wrap: item.wire()})
        ids.append(owner_id)
    return ids


def _conditions(ctx: StepContext, items: list[Any], owner_field: str, id_field: str, listing: Any, create: Any) -> list[str]:
    """Structure or agency conditions: created unless the owner has an active one with the same name."""
    ids = []
    for item in items:
        found = ctx.call(listing, getattr(item, owner_field)).conditions
        same = [getattr(c, id_field) for c in found if c.name == item.name and c.status != "CANCELED" and getattr(c, id_field)]
        ids.append(same[0] if same else getattr(ctx.call(create, request=item), id_field))
    return ids


def _custom_fields(ctx: StepContext) -> Outcome:
    ids = []
    for item in ctx.input.customFields:
        if item.agencyId:
            op = Catalogue.create_agency_custom_field
        else:
            op = Catalogue.create_structure_custom_field if ctx.input.form == "current" else Catalogue.create_custom_field_earlier
        ids.append(ctx.call(op, request=item).customFieldId)
    return Advance({"customFieldIds": ids})


def _section(name: str, op: Any, run: Any, given: str) -> CallStep:
    def body(ctx: StepContext, send: Any) -> Outcome:
        result: Outcome = run(ctx)
        return result

    return call(name, op, lambda ctx: Call(), when=lambda ctx: bool(getattr(ctx.input, given)), body=body)


def _setup_summary(data: Any, outputs: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {"form": data.form}
    for output in outputs.values():
        merged.update(output)
    return merged


def _structures(ctx: StepContext) -> Outcome:
    structures = ctx.input.structures
    return Advance(
        {
            "structureIds": _owners(
                ctx, structures, "structureId", Catalogue.get_structure, Catalogue.create_structure, "structure"
            )
        }
    )


def _agencies(ctx: StepContext) -> Outcome:
    return Advance(
        {"agencyIds": _owners(ctx, ctx.input.agencies, "agencyId", Catalogue.get_agency, Catalogue.create_agency, "agency")}
    )


def _structure_conditions(ctx: StepContext) -> Outcome:
    listing, create = Catalogue.list_structure_conditions, Catalogue.create_structure_condition
    ids = _conditions(ctx, ctx.input.structureConditions, "structureId", "structureConditionId", listing, create)
    return Advance({"structureConditionIds": ids})


def _agency_conditions(ctx: StepContext) -> Outcome:
    listing, create = Catalogue.list_agency_conditions, Catalogue.create_agency_condition
    ids = _conditions(ctx, ctx.input.agencyConditions, "agencyId", "agencyConditionId", listing, create)
    return Advance({"agencyConditionIds": ids})


RESERVATION_SETUP = Flow(
    "reservation_setup",
    SetupInput,
    (
        _section("service", Catalogue.set_reservation_service, _service, "service"),
        _section("terms", Catalogue.create_terms_and_conditions, _terms, "termsAndConditions"),
        _section("structures", Catalogue.create_structure, _structures, "structures"),
        _section("agencies", Catalogue.create_agency, _agencies, "agencies"),
        _section("structure_conditions", Catalogue.create_structure_condition, _structure_conditions, "structureConditions"),
        _section("agency_conditions", Catalogue.create_agency_condition, _agency_conditions, "agencyConditions"),
        _section("custom_fields", Catalogue.create_structure_custom_field, _custom_fields, "customFields"),
    ),
    _setup_summary,
    None,
    "reservation-guarantee set-up: service switch, terms, structures, agencies, conditions, custom fields",
)
