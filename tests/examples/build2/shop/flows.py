"""Build 2 of the shop's flows: ``shop_order`` changed (its fraud check renamed ``risk_check``, a
``notify`` step added after the ledger), build 1's definition kept as a previous version so that the
flows started on it go on on it (docs/deploys.md, Rolling deploys).

Build 1's definition is kept as its code was: here it is loaded from examples/shop (a real project keeps
the module, say ``shop/flows_v1.py``, until ``durapay flows versions`` shows it drained).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from durapay.flows import Flow, StepInput, input_order_id, payment, settle, step, summarize
from durapay.gateway import Catalogue

_BUILD1 = Path(__file__).resolve().parents[4] / "examples" / "shop" / "shop" / "flows.py"
_spec = importlib.util.spec_from_file_location("shop.flows_v1", _BUILD1)
assert _spec is not None and _spec.loader is not None
v1 = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = v1  # (its models' annotations are resolved in its module)
_spec.loader.exec_module(v1)


def notify(given: StepInput) -> dict[str, Any]:
    """Tell the customer (here: record whom), after the ledger."""
    return {"told": given.input.customer, "posting": given.outputs["post_ledger"]["posting"]}


SHOP_ORDER = Flow(
    "shop_order",
    v1.ShopOrder,
    (
        step(v1.fraud_check, name="risk_check", retry=5),
        payment("charge", Catalogue.create_moto_order, v1.charge_request, reads=("risk_check",)),
        settle("settle", "charge"),
        step(v1.post_ledger, reads=("charge",)),
        step(notify, reads=("post_ledger",)),
    ),
    summarize,
    input_order_id,
    "the shop's order: risk check, MOTO charge, ledger posting, the customer told",
    label="shop 2",
    previous=(v1.SHOP_ORDER,),
)

FLOWS = (SHOP_ORDER,)
