"""``durapay schedules ls`` piped and on a terminal: schedule ids whole, one line per schedule; ``resolve``
an occurrence whose flow is gone, and ``resume`` refused until then."""

from __future__ import annotations

import json

import pytest

from durapay.config import GatewaySettings
from durapay.gateway import Catalogue, GatewayClient
from durapay.service.runtime import Runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.schedules import Schedules
from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import TERMINAL
from tests.simulator.support import order, session
from tests.workflows.schedules.harness import stop_on_a_gone_flow

ADD = ("schedules", "add", "--contract", "contract-with-a-long-name-01", "--amount", "1990", "--description", "Gym")


def test_schedule_ids_are_never_wrapped(engine_side: Runtime) -> None:
    """Piped, ``schedules ls`` wrapped its table at 80 columns and split ids over two lines."""
    created = [
        json.loads(invoke(*ADD, "--every", "month", "--day", str(day), "--timezone", "Europe/Rome", "--json").stdout)["id"]
        for day in (1, 15)
    ]
    piped = invoke("schedules", "ls")
    assert piped.exit_code == 0, piped.output
    assert sorted(line.split("\t")[0] for line in piped.stdout.splitlines()) == sorted(created)
    assert all(len(line.split("\t")) == 8 for line in piped.stdout.splitlines())
    for columns in ("80", "100"):
        table = invoke("schedules", "ls", env={**TERMINAL, "COLUMNS": columns})
        for schedule_id in created:
            [line] = [line for line in table.stdout.splitlines() if schedule_id in line]
            assert "contract-with-a-long-name-01" in line


def gone(engine_side: Runtime) -> tuple[str, str]:
    """A schedule stopped because its first occurrence's flow is gone: (schedule id, occurrence)."""
    schedule_id = json.loads(invoke(*ADD, "--every", "month", "--day", "1", "--json").stdout)["id"]
    return schedule_id, stop_on_a_gone_flow(Schedules(engine_side.engine), schedule_id).occurrence


def test_resolve_as_not_charged_then_resume(engine_side: Runtime) -> None:
    schedule_id, occurrence = gone(engine_side)
    refused = invoke("schedules", "resume", schedule_id)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1, refused.output
    assert occurrence in refused.stderr and f"durapay schedules resolve {schedule_id} {occurrence}" in refused.stderr
    done = invoke("schedules", "resolve", schedule_id, occurrence, "not_charged")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        f"schedule {schedule_id}: needs_attention; occurrence {occurrence} closed without a charge, never fired again "
        "(an occurrence is never charged twice)",
        f"resume it to go on: durapay schedules resume {schedule_id}",
    ]
    shown = json.loads(invoke("schedules", "show", schedule_id, "--json").stdout)
    assert shown["counts"]["not_charged"] == 1 and shown["open"] == []
    again = invoke("schedules", "resolve", schedule_id, occurrence, "not_charged")
    assert again.exit_code == 2 and f"no open occurrence '{occurrence}'" in again.stderr
    assert invoke("schedules", "resume", schedule_id).stdout == f"schedule {schedule_id}: active\n"


def test_resolve_as_charged_with_the_operation_found(engine_side: Runtime) -> None:
    schedule_id, occurrence = gone(engine_side)
    done = invoke("schedules", "resolve", schedule_id, occurrence, "charged", "--operation-id", "op-42", "--json")
    assert done.exit_code == 0, done.output
    view = json.loads(done.stdout)
    assert view["counts"]["charged"] == 1 and view["last"]["operationId"] == "op-42" and view["last"]["by"] == "cli"


def test_a_misspelt_outcome_or_an_unknown_schedule_is_one_error_line(engine_side: Runtime) -> None:
    schedule_id, occurrence = gone(engine_side)
    misspelt = invoke("schedules", "resolve", schedule_id, occurrence, "charge")
    assert misspelt.exit_code == 2
    assert misspelt.stderr == (
        "durapay: schedule: outcome: unknown value 'charge'; did you mean `charged`? (known values: charged, not_charged)\n"
    )
    as_json = json.loads(invoke("schedules", "resolve", schedule_id, occurrence, "paid", "--json").stderr)
    assert (as_json["error"], as_json["field"]) == ("invalid_input", "outcome")
    missing = invoke("schedules", "resolve", "s000000000000", occurrence, "charged")
    assert missing.exit_code == 2 and missing.stderr == "durapay: no schedule 's000000000000'\n"
    active = json.loads(invoke(*ADD, "--every", "month", "--day", "2", "--json").stdout)["id"]
    refused = invoke("schedules", "resolve", active, occurrence, "charged")
    assert refused.exit_code == 2 and "is active" in refused.stderr


def test_schedules_read_in_major_units_and_rules_in_words(engine_side: Runtime) -> None:
    """``schedules show`` printed the rule as raw JSON and 1990 EUR for 19.90 EUR; ``--json`` keeps both."""
    schedule_id = json.loads(invoke(*ADD, "--every", "month", "--day", "5", "--json").stdout)["id"]
    shown = invoke("schedules", "show", schedule_id).stdout.splitlines()
    assert "amount\t19.90 EUR" in shown and "rule\tmonthly on day 5" in shown, shown
    [line] = invoke("schedules", "ls").stdout.splitlines()
    assert line.split("\t")[3:5] == ["19.90 EUR", "monthly on day 5"]
    as_json = json.loads(invoke("schedules", "show", schedule_id, "--json").stdout)
    assert (as_json["amount"], as_json["rule"]) == (1990, {"every": "month", "day": 5})


def test_add_checks_the_contract_at_the_gateway(engine_side: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 finding 11: ``schedules add --contract`` took a contract the gateway does not know, found
    at the first charge a month later. With the customer, the contract is looked up when the schedule is
    made; without, the command says it was not checked."""
    with SimulatorServer(SimulatorConfig(seed=41)) as sim:
        monkeypatch.setenv("DURAPAY_GATEWAY__BASE_URL", sim.base_url)
        with GatewayClient(GatewaySettings(base_url=sim.base_url)) as client:
            for contract_id, kind in (("ctr-mit-41", "MIT_UNSCHEDULED"), ("ctr-cit-41", "CIT")):
                recurrence = {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": kind}
                request = {
                    "order": order(f"first-{contract_id}", customerId="cust-41"),
                    "paymentSession": session(recurrence=recurrence),
                }
                client.call(Catalogue.create_hpp_order, request=request)
                assert sim.admin.complete_hpp(f"first-{contract_id}")["operationResult"] == "EXECUTED"
        monthly = ("--amount", "1990", "--description", "Gym", "--every", "month", "--day", "1", "--json")
        made = invoke("schedules", "add", "--contract", "ctr-mit-41", "--customer", "cust-41", *monthly)
        assert made.exit_code == 0, made.output
        for contract_id, customer, field, words in (
            (
                "ctr-typo-41",
                "cust-41",
                "contractId",
                "has no contract 'ctr-typo-41' at the gateway (its contracts: ctr-cit-41, ctr-mit-41)",
            ),
            ("ctr-cit-41", "cust-41", "contractId", "is CIT: the merchant cannot charge it"),
            ("ctr-mit-41", "cust-nobody", "customerId", "the gateway knows no customer 'cust-nobody'"),
        ):
            refused = invoke("schedules", "add", "--contract", contract_id, "--customer", customer, *monthly)
            assert refused.exit_code == 2, refused.output
            error = json.loads(refused.stderr)
            assert error["field"] == field and words in error["reason"], error
        unchecked = invoke("schedules", "add", "--contract", "ctr-any", *monthly[:-1])
        assert unchecked.exit_code == 0 and "the contract was not checked at the gateway" in unchecked.stderr, unchecked.output
    assert len(Schedules(engine_side.engine).list()) == 2, "nothing written for a refused one"
