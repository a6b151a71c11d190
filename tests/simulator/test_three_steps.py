"""Three steps with 3DS (frictionless, challenge through the ACS page, failure, forgery) and init/pay."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from durapay.gateway import THREEDS_NOT_NEEDED, BadRequest, Catalogue, GatewayClient, ThreeStepsInitResponse
from durapay.simulator import SimulatorServer
from tests.simulator.support import APPROVE, CHALLENGE, DECLINE, THREEDS_FAIL, card, order


def _init(client: GatewayClient, order_id: str, pan: str) -> ThreeStepsInitResponse:
    return client.call(Catalogue.three_steps_init, request={"order": order(order_id), "card": card(pan)})


def _pay(client: GatewayClient, init: ThreeStepsInitResponse, pan: str, **extra: object) -> str:
    request = {"operationId": init.operation.operationId, "order": order(str(init.operation.orderId)), "card": card(pan), **extra}
    return str(client.call(Catalogue.three_steps_payment, request=request).operation.operationResult)


def _validate(client: GatewayClient, operation_id: str, pares: str) -> str:
    answer = client.call(Catalogue.three_steps_validation, request={"operationId": operation_id, "threeDSAuthResponse": pares})
    return str(answer.operation.operationResult)


def test_a_frictionless_card_skips_the_challenge_and_validation(client: GatewayClient, sim: SimulatorServer) -> None:
    """As the real test environment answers it: ``ENROLLED`` with ``threeDSAuthRequest: "notneeded"`` (and
    an ACS URL nobody needs): only ``threeDSAuthRequest`` says whether the customer is challenged."""
    init = _init(client, "o-1", APPROVE)
    assert (init.operation.operationType, init.operation.operationResult) == ("AUTHORIZATION", "PENDING")
    assert (init.threeDSEnrollmentStatus, init.threeDSAuthRequest, init.threeDSAuthUrl) == (
        "ENROLLED",
        THREEDS_NOT_NEEDED,
        sim.root_url + "/_sim/acs",
    )
    assert _pay(client, init, APPROVE) == "EXECUTED"
    op = client.call(Catalogue.get_operation, init.operation.operationId)
    assert op.operationType == "CAPTURE"
    assert op.additionalData is not None and op.additionalData["responseCode"] == "000"


def test_a_challenge_card_goes_through_the_acs_form_like_a_browser(client: GatewayClient, sim: SimulatorServer) -> None:
    init = _init(client, "o-1", CHALLENGE)
    assert init.threeDSEnrollmentStatus == "ENROLLED" and init.threeDSAuthUrl == sim.root_url + "/_sim/acs"
    form = {
        "ThreeDsRequest": init.threeDSAuthRequest,
        "ReturnUrl": "https://shop.example/back?x=1",
        "transactionId": init.operation.operationId,
    }
    page = httpx.post(str(init.threeDSAuthUrl), data=form)
    assert page.status_code == 200 and 'action="/_sim/acs/challenge"' in page.text
    answer = httpx.post(sim.root_url + "/_sim/acs/challenge", data={**form, "decision": "approve"})
    assert answer.status_code == 303
    returned = urlsplit(answer.headers["location"])
    query = parse_qs(returned.query)
    assert (returned.netloc, returned.path, query["x"], query["paymentId"]) == (
        "shop.example",
        "/back",
        ["1"],
        [init.operation.operationId],
    )
    with pytest.raises(BadRequest) as early:
        _pay(client, init, CHALLENGE)
    assert "not validated" in early.value.errors[0].description
    assert _validate(client, init.operation.operationId, query["PaRes"][0]) == "THREEDS_VALIDATED"
    assert _pay(client, init, CHALLENGE, captureType="EXPLICIT") == "AUTHORIZED"
    with pytest.raises(BadRequest) as twice:
        _pay(client, init, CHALLENGE)
    assert "already completed" in twice.value.errors[0].description


@pytest.mark.parametrize(
    ("pan", "approve", "pares"), [(THREEDS_FAIL, True, None), (CHALLENGE, False, None), (CHALLENGE, True, "PARES-forged")]
)
def test_failed_or_forged_authentication_is_threeds_failed(
    client: GatewayClient, sim: SimulatorServer, pan: str, approve: bool, pares: str | None
) -> None:
    init = _init(client, "o-1", pan)
    issued = sim.admin.acs_challenge(init.operation.operationId, str(init.threeDSAuthRequest), approve)
    assert _validate(client, init.operation.operationId, pares or issued) == "THREEDS_FAILED"
    assert _pay(client, init, pan) == "THREEDS_FAILED"
    assert sim.admin.operations(order_id="o-1")[0]["amount"] == 1500
    assert client.call(Catalogue.get_order, "o-1").orderStatus.authorizedAmount == 0


def test_a_declining_card_is_declined_with_its_response_code(client: GatewayClient) -> None:
    init = _init(client, "o-1", DECLINE)
    assert _pay(client, init, DECLINE) == "DECLINED"
    op = client.call(Catalogue.get_operation, init.operation.operationId)
    assert op.additionalData and op.additionalData["responseCode"] == "100"


def test_payment_must_match_the_init(client: GatewayClient) -> None:
    init = _init(client, "o-1", APPROVE)
    with pytest.raises(BadRequest) as other_card:
        _pay(client, init, "4111111111111110")
    assert "card.pan" in other_card.value.errors[0].description


def test_the_acs_refuses_an_unknown_request(sim: SimulatorServer) -> None:
    answer = httpx.post(
        sim.root_url + "/_sim/acs/challenge", data={"ThreeDsRequest": "x", "transactionId": "1", "decision": "approve"}
    )
    assert answer.status_code == 400


def test_init_and_pay_in_two_calls(client: GatewayClient) -> None:
    init = client.call(Catalogue.svs_init_order, request={"order": order("svs-1"), "card": card(), "captureType": "EXPLICIT"})
    assert init.operation.operationResult == "PENDING"
    paid = client.call(Catalogue.svs_pay_operation, init.operation.operationId, request={"cvv": "123"})
    assert (paid.operation.operationId, paid.operation.operationResult) == (init.operation.operationId, "AUTHORIZED")
    with pytest.raises(BadRequest):
        client.call(Catalogue.svs_pay_operation, init.operation.operationId, request={})
