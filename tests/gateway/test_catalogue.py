"""The catalogue covers the gateway's interface exactly (83 methods and paths), and its flags are consistent."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from durapay.gateway import BY_NAME, CATALOGUE, Catalogue, GatewayModel, Reconcile, Version, operation

#: The repository root (tests/gateway/test_catalogue.py is two folders below it).
REPO = Path(__file__).resolve().parents[2]
#: DURAPAY_SPEC_FILE may name a copy of the gateway's interface description (Markdown, one
#: ``METHOD `path` `` per row) to compare the embedded pairs with; without it that comparison is skipped.
SPEC_FROM_ENV = os.environ.get("DURAPAY_SPEC_FILE") or ""
SPEC = Path(SPEC_FROM_ENV) if SPEC_FROM_ENV else None
needs_spec_file = pytest.mark.skipif(SPEC is None, reason="set DURAPAY_SPEC_FILE to compare with the interface description")

# The 83 method+path pairs of the gateway's interface description, in its order (the repository's own
# copy; compared with the description itself when DURAPAY_SPEC_FILE names it).
SPEC_PAIRS = """
POST /orders/hpp|POST /v3/orders/paybylink|POST /v2/orders/paybylink|POST /v1/orders/paybylink|POST /orders/paybylink
POST /paybylink/{linkId}/cancels|GET /v3/orders/paybylink|GET /v3/orders/paybylink/{Id}|GET /orders/paybylink
GET /orders/paybylink/{linkId}|POST /orders/paybylink/{linkId}/renewals|POST /v3/paybylink/{id}/modify
GET /v3/paybylink/exports/{format}|POST /v3/paybylink/qrcode/{id}|POST /v2/svs/order/init
POST /v2/svs/operation/{operationId}/pay|POST /orders/3steps/init|POST /orders/3steps/validation
POST /orders/3steps/payment|POST /orders/mit|POST /orders/card_verification|POST /orders/moto|POST /orders/walletpay
POST /orders/build|POST /build/finalize_payment|POST /build/cancel|GET /build/state|GET /build/cardData
GET /build/integrity|POST /build/confirm_payment|GET /orders|GET /orders/{orderId}|GET /operations
GET /operations/{operationId}|GET /operations/{operationId}/actions|POST /operations/{operationId}/refunds
POST /operations/{operationId}/captures|POST /operations/{operationId}/cancels|GET /contracts/customers/{customerId}
POST /contracts/{contractId}/deactivation|GET /payment_methods|GET /mccExchangeRates|POST /structures|GET /structures
GET /structures/{structureId}|POST /reservations|GET /reservations|GET /reservations/{reservationId}
POST /reservations/{reservationId}/paybylink|POST /no_shows|POST /incrementals|POST /delay_charges
POST /terms_and_conditions|GET /terms_and_conditions|GET /terms_and_conditions/{termsAndConditionsId}
POST /terms_and_conditions/{termsAndConditionsId}/cancels|POST /structure_conditions
GET /structure_conditions/structures/{structureid}|GET /structure_conditions/{structureConditionId}
POST /structure_conditions/{structureConditionId}/cancels|POST /structures/custom_fields
GET /structures/custom_fields/{customFieldId}|POST /agency_conditions|GET /agency_conditions/agencies/{agencyid}
GET /agency_conditions/{agencyConditionId}|POST /agency_conditions/{agencyConditionid}/cancels
GET /agency_conditions/{agencyConditionid}/pdf|POST /agencies|GET /agencies|GET /agencies/{agencyId}
POST /agencies/custom_fields|GET /agencies/custom_fields/{customFieldId}|POST /reservations/incremental_validation
POST /reservations/noshow_validation|POST /reservations/delaycharge_validation|POST /reservations/services
GET /reservations/services|POST /noshow_validation|POST /delaycharge_validation|POST /incremental_validation
POST /custom_fields|GET /custom_fields/{customFieldId}|POST /reservation/{reservationId}/mit
"""


def spec_pairs() -> list[tuple[str, str]]:
    items = [item.strip() for item in SPEC_PAIRS.replace("\n", "|").split("|") if item.strip()]
    return [(method, path) for method, path in (item.split(" ", 1) for item in items)]


def test_catalogue_is_every_pair_of_the_spec_once_in_order() -> None:
    pairs = [(op.method, op.path) for op in CATALOGUE]
    assert len(pairs) == 83 == len(set(pairs))
    assert pairs == spec_pairs()


def spec_file_pairs() -> list[tuple[str, str]]:
    """The method+path pairs of the spec file's endpoint tables, in its order (a ``GET, POST`` row gives two)."""
    assert SPEC is not None and SPEC.is_file(), f"DURAPAY_SPEC_FILE={SPEC_FROM_ENV!r} is not a file"
    found: list[tuple[str, str]] = []
    pattern = re.compile(r"^\|\s*((?:GET|POST)(?:\s*,\s*(?:GET|POST))*)\s*\|\s*(/[^\s|]*)\s*\|")
    for line in SPEC.read_text().splitlines():
        match = pattern.match(line)
        if match:
            found.extend((method.strip(), match.group(2)) for method in match.group(1).split(","))
    return found


def test_the_spec_file_is_only_the_one_named() -> None:
    assert (REPO / "pyproject.toml").is_file() and (REPO / "gateway").is_dir(), "REPO is the repository root"
    assert (Path(SPEC_FROM_ENV) if SPEC_FROM_ENV else None) == SPEC


@needs_spec_file
def test_embedded_pairs_match_the_spec_file() -> None:
    found = spec_file_pairs()
    assert len(found) == 83 == len(set(found))
    assert found == spec_pairs()


def test_names_are_unique_and_addressable() -> None:
    assert len(BY_NAME) == len(CATALOGUE)
    assert operation("get_order") is Catalogue.get_order
    assert Catalogue.get_order.task_name == "durapay.gateway.get_order"
    with pytest.raises(KeyError, match="no gateway operation"):
        operation("nope")


def test_versions_and_forms() -> None:
    assert Catalogue.create_paybylink_v1.version is Version.V1
    assert Catalogue.create_paybylink_v2.version is Version.V2
    assert Catalogue.create_paybylink_v3.version is Version.V3
    assert Catalogue.create_paybylink.version is Version.UNVERSIONED
    assert Catalogue.svs_init_order.version is Version.V2
    earlier = {op.path for op in CATALOGUE if op.version is Version.EARLIER}
    assert earlier == {
        "/noshow_validation",
        "/delaycharge_validation",
        "/incremental_validation",
        "/custom_fields",
        "/custom_fields/{customFieldId}",
        "/reservation/{reservationId}/mit",
    }


def test_every_entry_is_complete_and_consistent() -> None:
    for op in CATALOGUE:
        assert issubclass(op.response, GatewayModel), op.name
        assert op.request is None or issubclass(op.request, GatewayModel), op.name
        if op.method == "GET":
            assert op.retry_safe and not op.idempotency_key, op.name
        if op.idempotency_key:
            # A keyed money call is read back before a resend (the gateway may have forgotten the key).
            assert op.method == "POST" and op.retry_safe == (not op.moves_money), op.name
        if not op.retry_safe:
            # An unsafe POST needs a way to learn its outcome (a read, or its step's read-back, then a resend
            # with its key), or it is a set-up call that creates a gateway-numbered object (a duplicate of
            # which moves no money).
            assert op.reconcile is not None or op.idempotency_key or op.response.__name__.endswith("IdResponse"), op.name
        assert op.reconcile is None or isinstance(op.reconcile, Reconcile)


def test_notifying_operations_take_a_notification_url() -> None:
    notifying = {op.name for op in CATALOGUE if op.notifies}
    assert notifying == {
        "create_hpp_order",
        "create_paybylink_v3",
        "create_paybylink_v2",
        "create_paybylink_v1",
        "create_paybylink",
        "create_build_order",
        "create_reservation_paybylink",
    }
