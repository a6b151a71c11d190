"""The shop's own flow, ``shop_order``: a fraud check of the shop's own code, a MOTO charge at the gateway,
then a posting to the shop's ledger. Loaded by every durapay process with
``DURAPAY_FLOWS__MODULES=shop.flows`` (this folder on ``PYTHONPATH``, or the project installed).

The fraud check and the ledger are the shop's own Python: the fraud check refuses an order above the
shop's limit (``Final``: the flow ends failed, nothing charged) and asks to be tried again while its risk
service is down (``Retry``: the engine's backoff); the ledger posts once per order, keyed by the step's
idempotency key (the same on every try and every worker), so a posting sent twice is one posting.

The ledger here is a folder of JSON files (``SHOP_LEDGER``, default ``./ledger``): one file per
posting, named by its key, written once. A real shop would call its ledger's API with the same key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from durapay.flows import Final, Flow, Retry, StepInput, input_order_id, payment, settle, step, summarize
from durapay.gateway import Card, Catalogue, Order

#: The largest order the shop accepts without a person (minor units).
LIMIT = 500_00


class ShopOrder(BaseModel):
    """What the shop starts a flow with: the gateway's order and card, and the shop's customer."""

    order: Order
    card: Card
    customer: str = Field(min_length=1, max_length=80)


def ledger_folder() -> Path:
    return Path(os.environ.get("SHOP_LEDGER", "ledger"))


def fraud_check(given: StepInput) -> dict[str, Any]:
    """The shop's risk rules: too large is final; the risk service down (``SHOP_RISK_DOWN`` names a file
    that exists while it is down) is tried again."""
    down = os.environ.get("SHOP_RISK_DOWN")
    if down and Path(down).exists():
        raise Retry("the risk service is down")
    amount = int(given.input.order.amount)
    if amount > LIMIT:
        raise Final(f"amount {amount} is above the shop's limit of {LIMIT}")
    return {"score": amount % 97, "customer": given.input.customer}


def post_ledger(given: StepInput) -> dict[str, Any]:
    """Post the charge to the ledger, once per key (``open(..., "x")``: a second posting finds the first)."""
    operation = given.outputs["charge"]["operation"]
    folder = ledger_folder()
    folder.mkdir(parents=True, exist_ok=True)
    posting = {"key": given.idempotency_key, "operationId": operation["operationId"], "amount": operation.get("operationAmount")}
    path = folder / f"{given.idempotency_key}.json"
    try:
        with path.open("x") as file:
            json.dump(posting, file)
    except FileExistsError:
        posting = json.loads(path.read_text())
    return {"posting": posting["key"], "operationId": posting["operationId"]}


def charge_request(ctx: Any) -> dict[str, Any]:
    return {"order": {}, "card": ctx.input.card.wire()}


SHOP_ORDER = Flow(
    "shop_order",
    ShopOrder,
    (
        step(fraud_check, retry=5),
        payment("charge", Catalogue.create_moto_order, charge_request, reads=("fraud_check",)),
        settle("settle", "charge"),
        step(post_ledger, reads=("charge",)),
    ),
    summarize,
    input_order_id,
    "the shop's order: fraud check, MOTO charge, ledger posting",
    label="shop 1",
)

FLOWS = (SHOP_ORDER,)
