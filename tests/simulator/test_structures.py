"""The reservation area's set-up objects: structures, agencies, conditions (with PDF), custom fields."""

from __future__ import annotations

import httpx
import pytest

from durapay.gateway import BadRequest, Catalogue, GatewayClient, NotFound
from durapay.simulator import SimulatorServer
from durapay.simulator._structures import pdf_document
from tests.simulator.scenario import Scenario


@pytest.fixture
def scenario(client: GatewayClient, sim: SimulatorServer) -> Scenario:
    return Scenario(client, sim)


def test_an_id_is_created_once_and_read_back_with_its_defaults(client: GatewayClient, scenario: Scenario) -> None:
    structure_id = scenario.structure()
    with pytest.raises(BadRequest) as twice:
        client.call(Catalogue.create_structure, request={"structure": {"structureId": structure_id}})
    assert "structure.structureId" in twice.value.errors[0].description
    structure = client.call(Catalogue.get_structure, structure_id).structure
    assert structure.status == "ACTIVE" and structure.structureCreationDate
    with pytest.raises(NotFound):
        client.call(Catalogue.get_agency, "no-such")


def test_conditions_are_listed_per_owner_and_cancelled(client: GatewayClient, scenario: Scenario) -> None:
    structure_id = scenario.structure()
    body = {"structureId": structure_id, "name": "Flexible", "termsAndConditions": scenario.condition_texts()}
    condition_id = client.call(Catalogue.create_structure_condition, request=body).structureConditionId
    client.call(Catalogue.cancel_structure_condition, condition_id)
    [summary] = client.call(Catalogue.list_structure_conditions, structure_id).conditions
    assert (summary.structureConditionId, summary.language, summary.status) == (condition_id, "eng", "CANCELED")
    assert client.call(Catalogue.list_structure_conditions, scenario.structure()).conditions == []
    with pytest.raises(NotFound):
        client.call(Catalogue.list_structure_conditions, "no-such")


def test_the_agency_condition_pdf_shows_the_decoded_condition(client: GatewayClient, scenario: Scenario) -> None:
    body = {"agencyId": scenario.agency(), "name": "Agency terms", "termsAndConditions": scenario.condition_texts()}
    condition_id = client.call(Catalogue.create_agency_condition, request=body).agencyConditionId
    document = client.call(Catalogue.get_agency_condition_pdf, condition_id).content
    assert document.startswith(b"%PDF-1.4") and b"(No refunds after check-in.)" in document


def test_the_pdf_cross_reference_points_at_its_objects() -> None:
    document = pdf_document(["a (bracketed) line", "another"])
    xref_at = int(document.rsplit(b"startxref\n", 1)[1].split(b"\n")[0])
    assert document[xref_at:].startswith(b"xref\n0 6\n")
    offsets = [int(line[:10]) for line in document[xref_at:].split(b"\n")[3:8]]
    assert [document[offset:].split(b" ")[0] for offset in offsets] == [b"1", b"2", b"3", b"4", b"5"]
    assert b"(a \\(bracketed\\) line) '" in document


def test_custom_fields_belong_to_their_kind_of_owner(client: GatewayClient, scenario: Scenario) -> None:
    created = client.call(
        Catalogue.create_custom_field_earlier, request={"structureId": scenario.structure(), "customFieldTitle": "Room"}
    )
    assert client.call(Catalogue.get_structure_custom_field, created.customFieldId).customFieldTitle == "Room"
    with pytest.raises(NotFound):
        client.call(Catalogue.get_agency_custom_field, created.customFieldId)
    with pytest.raises(BadRequest) as no_owner:
        client.call(Catalogue.create_structure_custom_field, request={"customFieldTitle": "Room"})
    assert "structureId" in no_owner.value.errors[0].description


def test_the_structure_list_answers_as_documented_and_the_client_reads_both_forms(
    client: GatewayClient, scenario: Scenario, sim: SimulatorServer
) -> None:
    """``GET /structures`` answers the same ``{structure: {...}}`` object as ``GET /structures/{id}`` for
    the terminal's structure (as published); with several the same name holds an array; with none, 404.
    The client reads either form as a list (agencies mirror structures)."""
    headers = {"X-Api-Key": sim.config.api_key}
    assert httpx.get(sim.base_url + "/structures", headers=headers).status_code == 404
    first = scenario.structure()
    one = httpx.get(sim.base_url + "/structures", headers=headers).json()
    assert isinstance(one["structure"], dict) and one["structure"]["structureId"] == first
    assert [s.structureId for s in client.call(Catalogue.list_structures).structure] == [first]
    second = scenario.structure()
    both = httpx.get(sim.base_url + "/structures", headers=headers).json()
    assert [s["structureId"] for s in both["structure"]] == [first, second]
    assert [s.structureId for s in client.call(Catalogue.list_structures).structure] == [first, second]

    agency = scenario.agency()
    assert httpx.get(sim.base_url + "/agencies", headers=headers).json()["agency"]["agencyId"] == agency
    assert [a.agencyId for a in client.call(Catalogue.list_agencies).agency] == [agency]
