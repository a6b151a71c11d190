"""DURAPAY_FLOWS__MODULES (``workflows.engine.modules``): the merchant's kinds beside durapay's, refusals named."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from durapay.config import load_settings
from durapay.config.settings import SettingsError
from durapay.flows import Flow, step
from durapay.workflows.engine.modules import registry
from durapay.workflows.flows import REGISTRY
from tests.workflows.engine_support import DemoInput, summary


def check(given: object) -> dict[str, object]:
    return {}


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    made = types.ModuleType("merchant_flows_test")
    sys.modules[made.__name__] = made
    yield made
    del sys.modules[made.__name__]


def test_a_modules_flows_join_durapays_kinds(module: types.ModuleType) -> None:
    module.MINE = Flow("mine", DemoInput, (step(check),), summary)  # type: ignore[attr-defined]
    kinds = registry(["merchant_flows_test"])
    assert kinds["mine"] is module.MINE and set(REGISTRY) < set(kinds)
    module.FLOWS = ()  # type: ignore[attr-defined]  # FLOWS, when given, is what the module declares
    with pytest.raises(SettingsError, match="declare no flow"):
        registry(["merchant_flows_test"])


def test_refusals_name_the_module_and_the_reason(module: types.ModuleType) -> None:
    with pytest.raises(SettingsError, match=r"DURAPAY_FLOWS__MODULES: module shop_missing\.flows does not import"):
        registry(["shop_missing.flows"])
    module.FLOWS = (Flow("moto", DemoInput, (step(check),), summary),)  # type: ignore[attr-defined]
    with pytest.raises(SettingsError, match="kind 'moto' is one of durapay's own"):
        registry(["merchant_flows_test"])


def test_the_setting_is_a_comma_list_of_module_names() -> None:
    assert load_settings({"flows": {"modules": "shop.flows, shop.refunds"}}).flows.names == ["shop.flows", "shop.refunds"]
    assert load_settings({}).flows.names == []
    with pytest.raises(SettingsError, match="is not a module name"):
        load_settings({"flows": {"modules": "shop/flows.py"}})
