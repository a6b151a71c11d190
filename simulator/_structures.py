"""Reservation area, the merchant's set-up: structures, agencies, terms and conditions, structure and agency
conditions (with PDF), custom fields and services.

Created objects are kept as the gateway shows them (the request's own fields plus creation date and
status). Creating an id twice is refused (400 PS0026 naming the field); cancels are repeatable (the
catalogue marks them retry safe). Agencies mirror structures (nothing is published: docs/gateway.md).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any

from durapay.gateway import (
    AgencyConditionRequest,
    AgencyRequest,
    CustomFieldRequest,
    ServiceQuery,
    ServiceRequest,
    StructureConditionRequest,
    StructureRequest,
    TermsAndConditionsRequest,
)
from durapay.simulator._protocol import Call, Handler, Reply, SimError, ok

if TYPE_CHECKING:
    from durapay.simulator._core import Simulator

SERVICE_NAMES = frozenset({"DISPUTELESS"})


def _get(store: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    found = store.get(key)
    if found is None:
        raise SimError.not_found()
    return found


def create_structure(sim: Simulator, call: Call) -> Reply:
    structure = call.body(StructureRequest).structure.wire()
    if structure["structureId"] in sim.state.structures:
        raise SimError.invalid("structure.structureId", "already exists")
    structure.setdefault("status", "ACTIVE")
    structure.setdefault("structureCreationDate", sim.state.now_iso())
    sim.state.structures[structure["structureId"]] = structure
    return ok()


def _one_or_many(name: str, records: list[dict[str, Any]]) -> Reply:
    """The published list answer is the same ``{structure: {...}}`` object as one structure's (a terminal's
    structure); with several the same name holds an array; with none, 404 (docs/gateway.md)."""
    if not records:
        raise SimError.not_found()
    return ok({name: records[0] if len(records) == 1 else records})


def list_structures(sim: Simulator, call: Call) -> Reply:
    return _one_or_many("structure", list(sim.state.structures.values()))


def get_structure(sim: Simulator, call: Call) -> Reply:
    return ok({"structure": _get(sim.state.structures, call.params["structureId"])})


def create_agency(sim: Simulator, call: Call) -> Reply:
    agency = call.body(AgencyRequest).agency.wire()
    if agency["agencyId"] in sim.state.agencies:
        raise SimError.invalid("agency.agencyId", "already exists")
    agency.setdefault("status", "ACTIVE")
    agency.setdefault("agencyCreationDate", sim.state.now_iso())
    sim.state.agencies[agency["agencyId"]] = agency
    return ok()


def list_agencies(sim: Simulator, call: Call) -> Reply:
    return _one_or_many("agency", list(sim.state.agencies.values()))


def get_agency(sim: Simulator, call: Call) -> Reply:
    return ok({"agency": _get(sim.state.agencies, call.params["agencyId"])})


def create_terms_and_conditions(sim: Simulator, call: Call) -> Reply:
    body = call.body(TermsAndConditionsRequest).wire()
    terms_id = sim.state.new_id("T")
    sim.state.terms[terms_id] = {
        "termsAndConditionsId": terms_id,
        "tecCreationDate": sim.state.now_iso(),
        "status": "ACTIVE",
        **body,
    }
    return ok({"termsAndConditionsId": terms_id})


def list_terms_and_conditions(sim: Simulator, call: Call) -> Reply:
    return ok({"termsAndConditions": list(sim.state.terms.values())})


def get_terms_and_conditions(sim: Simulator, call: Call) -> Reply:
    return ok(_get(sim.state.terms, call.params["termsAndConditionsId"]))


def cancel_terms_and_conditions(sim: Simulator, call: Call) -> Reply:
    terms_id = call.params["termsAndConditionsId"]
    terms = _get(sim.state.terms, terms_id)
    for reservation_id, reservation in sim.state.reservations.items():
        order = sim.state.orders.get(sim.state.reservation_orders.get(reservation_id, ""))
        if terms_id in (reservation.get("termsAndConditionsIds") or []) and order and order.operation_ids:
            raise SimError.invalid("termsAndConditionsId", f"used by reservation {reservation_id}, which has operations")
    terms["status"] = "CANCELED"
    return ok(True)


def _condition(
    sim: Simulator, owner_field: str, owner_store: dict[str, dict[str, Any]], body: dict[str, Any], id_field: str
) -> dict[str, Any]:
    if body[owner_field] not in owner_store:
        raise SimError.invalid(owner_field, f"unknown {owner_field[:-2]} {body[owner_field]}")
    condition_id = sim.state.new_id("C")
    return {id_field: condition_id, "tecCreationDate": sim.state.now_iso(), "status": "ACTIVE", **body}


def _summaries(conditions: list[dict[str, Any]], id_field: str) -> list[dict[str, Any]]:
    return [
        {
            id_field: c[id_field],
            "name": c.get("name"),
            "tecCreationDate": c.get("tecCreationDate"),
            "language": (c.get("termsAndConditions") or [{}])[0].get("language"),
            "status": c.get("status"),
        }
        for c in conditions
    ]


def create_structure_condition(sim: Simulator, call: Call) -> Reply:
    body = call.body(StructureConditionRequest).wire()
    condition = _condition(sim, "structureId", sim.state.structures, body, "structureConditionId")
    sim.state.structure_conditions[condition["structureConditionId"]] = condition
    return ok({"structureConditionId": condition["structureConditionId"]})


def list_structure_conditions(sim: Simulator, call: Call) -> Reply:
    structure_id = call.params["structureid"]
    _get(sim.state.structures, structure_id)
    found = [c for c in sim.state.structure_conditions.values() if c["structureId"] == structure_id]
    return ok(_summaries(found, "structureConditionId"))


def get_structure_condition(sim: Simulator, call: Call) -> Reply:
    return ok(_get(sim.state.structure_conditions, call.params["structureConditionId"]))


def cancel_structure_condition(sim: Simulator, call: Call) -> Reply:
    _get(sim.state.structure_conditions, call.params["structureConditionId"])["status"] = "CANCELED"
    return ok(True)


def create_agency_condition(sim: Simulator, call: Call) -> Reply:
    body = call.body(AgencyConditionRequest).wire()
    condition = _condition(sim, "agencyId", sim.state.agencies, body, "agencyConditionId")
    sim.state.agency_conditions[condition["agencyConditionId"]] = condition
    return ok({"agencyConditionId": condition["agencyConditionId"]})


def list_agency_conditions(sim: Simulator, call: Call) -> Reply:
    agency_id = call.params["agencyid"]
    _get(sim.state.agencies, agency_id)
    found = [c for c in sim.state.agency_conditions.values() if c["agencyId"] == agency_id]
    return ok(_summaries(found, "agencyConditionId"))


def get_agency_condition(sim: Simulator, call: Call) -> Reply:
    return ok(_get(sim.state.agency_conditions, call.params["agencyConditionId"]))


def cancel_agency_condition(sim: Simulator, call: Call) -> Reply:
    _get(sim.state.agency_conditions, call.params["agencyConditionid"])["status"] = "CANCELED"
    return ok(True)


def _plain(text: str | None) -> str:
    """Condition texts are Base64 HTML: decode and strip the tags for the PDF (raw text if not Base64)."""
    if not text:
        return ""
    try:
        decoded = base64.b64decode(text, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        decoded = text
    return re.sub(r"<[^>]+>", " ", decoded).strip()


def get_agency_condition_pdf(sim: Simulator, call: Call) -> Reply:
    condition = _get(sim.state.agency_conditions, call.params["agencyConditionid"])
    lines = [
        f"Agency condition {condition['agencyConditionId']}: {condition.get('name', '')}",
        f"Agency: {condition['agencyId']}",
    ]
    for text in condition.get("termsAndConditions") or []:
        lines.append(f"[{text.get('language', '')}]")
        lines.append(_plain(text.get("textStructureCondition")))
        lines.append(_plain(text.get("textCancellationCondition")))
    return Reply(content=pdf_document([line for line in lines if line]), media_type="application/pdf")


def pdf_document(lines: list[str]) -> bytes:
    """A minimal valid one-page PDF 1.4 showing ``lines`` in Helvetica."""

    def escape(text: str) -> str:
        return text[:110].replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    content = "BT /F1 11 Tf 56 790 Td 15 TL " + " ".join(f"({escape(line)}) '" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(content.encode('latin-1', errors='replace'))} >>\nstream\n{content}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1", errors="replace")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _custom_field(sim: Simulator, call: Call, owner: str) -> Reply:
    body = call.body(CustomFieldRequest).wire()
    owner_id = body.get(owner)
    store = sim.state.structures if owner == "structureId" else sim.state.agencies
    if not owner_id:
        raise SimError.invalid(owner, "required")
    if owner_id not in store:
        raise SimError.invalid(owner, f"unknown {owner[:-2]} {owner_id}")
    field_id = sim.state.new_id("F")
    target = sim.state.structure_custom_fields if owner == "structureId" else sim.state.agency_custom_fields
    target[field_id] = {"customFieldId": field_id, **body}
    return ok({"customFieldId": field_id})


def create_structure_custom_field(sim: Simulator, call: Call) -> Reply:
    return _custom_field(sim, call, "structureId")


def create_agency_custom_field(sim: Simulator, call: Call) -> Reply:
    return _custom_field(sim, call, "agencyId")


def get_structure_custom_field(sim: Simulator, call: Call) -> Reply:
    return ok(_get(sim.state.structure_custom_fields, call.params["customFieldId"]))


def get_agency_custom_field(sim: Simulator, call: Call) -> Reply:
    return ok(_get(sim.state.agency_custom_fields, call.params["customFieldId"]))


def set_reservation_service(sim: Simulator, call: Call) -> Reply:
    body = call.body(ServiceRequest)
    if body.serviceName not in SERVICE_NAMES:
        raise SimError.invalid("serviceName", f"must be one of {sorted(SERVICE_NAMES)}")
    sim.state.services[f"{body.serviceName}|{body.terminalId or ''}"] = body.wire()
    return ok()


def list_reservation_services(sim: Simulator, call: Call) -> Reply:
    query = call.body(ServiceQuery)
    found = [
        service
        for service in sim.state.services.values()
        if (query.serviceName is None or service["serviceName"] == query.serviceName)
        and (query.terminalId is None or service.get("terminalId") == query.terminalId)
    ]
    return ok({"services": found})


HANDLERS: dict[str, Handler] = {
    "create_structure": create_structure,
    "list_structures": list_structures,
    "get_structure": get_structure,
    "create_agency": create_agency,
    "list_agencies": list_agencies,
    "get_agency": get_agency,
    "create_terms_and_conditions": create_terms_and_conditions,
    "list_terms_and_conditions": list_terms_and_conditions,
    "get_terms_and_conditions": get_terms_and_conditions,
    "cancel_terms_and_conditions": cancel_terms_and_conditions,
    "create_structure_condition": create_structure_condition,
    "list_structure_conditions": list_structure_conditions,
    "get_structure_condition": get_structure_condition,
    "cancel_structure_condition": cancel_structure_condition,
    "create_agency_condition": create_agency_condition,
    "list_agency_conditions": list_agency_conditions,
    "get_agency_condition": get_agency_condition,
    "cancel_agency_condition": cancel_agency_condition,
    "get_agency_condition_pdf": get_agency_condition_pdf,
    "create_structure_custom_field": create_structure_custom_field,
    "get_structure_custom_field": get_structure_custom_field,
    "create_agency_custom_field": create_agency_custom_field,
    "get_agency_custom_field": get_agency_custom_field,
    "create_custom_field_earlier": create_structure_custom_field,
    "get_custom_field_earlier": get_structure_custom_field,
    "set_reservation_service": set_reservation_service,
    "list_reservation_services": list_reservation_services,
}
