"""durapay flows manifest, durapay deploy check and durapay flows versions against a real Valkey."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from durapay.service.runtime import Runtime
from durapay.workflows.engine.states import FlowState
from durapay.workflows.flows import REGISTRY
from tests.service.cli.conftest import invoke


def moto(order_id: str) -> dict[str, Any]:
    return {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR", "description": "x"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


def test_the_manifest_lists_every_kind_with_its_versions_current_first(cli_env: dict[str, str]) -> None:
    result = invoke("flows", "manifest", "--json")
    assert result.exit_code == 0, result.output
    kinds = json.loads(result.stdout)["kinds"]
    assert set(kinds) == set(REGISTRY)
    moto_versions = kinds["moto"]
    assert [entry["version"] for entry in moto_versions] == [REGISTRY["moto"].version]
    assert moto_versions[0]["current"] is True
    assert [(step["name"], step["kind"], step.get("operation")) for step in moto_versions[0]["steps"]] == [
        ("pay", "call", "create_moto_order"),
        ("settle", "call", "get_operation"),
    ]


def test_deploy_check_passes_on_the_codes_own_flows_and_names_those_a_manifest_drops(
    engine_side: Runtime, tmp_path: Path
) -> None:
    empty = invoke("deploy", "check", "--json")
    assert empty.exit_code == 0, empty.output
    assert json.loads(empty.stdout)["stranded"] == []
    later = engine_side.engine.clock.now() + 600
    sleeping = [engine_side.engine.start("moto", moto(f"dc-{n}"), run_at=later).id for n in range(2)]
    waiting = engine_side.engine.start("three_steps", {"order": moto("dc-3")["order"], "card": moto("dc-3")["card"]}).id
    report = json.loads(invoke("deploy", "check", "--json").stdout)
    assert report["ok"] is True
    by_kind = {group["kind"]: group for group in report["groups"]}
    assert by_kind["moto"]["count"] == 2 and by_kind["moto"]["steps"] == {"pay": 2}
    assert by_kind["moto"]["latest_deadline"] is not None and by_kind["moto"]["can_continue"] is True
    assert sorted(by_kind["moto"]["flows"]) == sorted(sleeping) and by_kind["three_steps"]["flows"] == [waiting]

    manifest = json.loads(invoke("flows", "manifest", "--json").stdout)
    manifest["kinds"]["moto"] = [{**manifest["kinds"]["moto"][0], "version": "0123456789ab"}]  # a build that changed moto
    shipped = tmp_path / "manifest.json"
    shipped.write_text(json.dumps(manifest))
    refused = invoke("deploy", "check", "--manifest", str(shipped), "--json")
    assert refused.exit_code == 1, refused.output
    answer = json.loads(refused.stdout)
    assert sorted(answer["stranded"]) == sorted(sleeping), "exactly the moto flows, none of the others"
    assert "does not hold version" in {g["kind"]: g for g in answer["groups"]}["moto"]["reason"]
    table = invoke("deploy", "check", "--manifest", str(shipped))
    assert table.exit_code == 1 and all(flow_id in table.stderr for flow_id in sleeping)

    versions = json.loads(invoke("flows", "versions", "--json").stdout)["versions"]
    rows = {(row["kind"], row["version"]): row for row in versions}
    assert rows[("moto", REGISTRY["moto"].version)]["count"] == 2 and not rows[("moto", REGISTRY["moto"].version)]["drained"]
    assert rows[("refund", REGISTRY["refund"].version)]["drained"] is True
    for flow_id in sleeping:
        engine_side.engine.cancel(flow_id)
    assert all(engine_side.engine.get(flow_id).state is FlowState.CANCELLED for flow_id in sleeping)
    # Cancelled, they are still counted while their records are kept: a late payment on one reopens it,
    # and accepting it runs its step on its own version.
    again = {(row["kind"], row["version"]): row for row in json.loads(invoke("flows", "versions", "--json").stdout)["versions"]}
    assert again[("moto", REGISTRY["moto"].version)]["states"] == {"cancelled": 2}
    assert not again[("moto", REGISTRY["moto"].version)]["drained"]
    kept = invoke("deploy", "check", "--manifest", str(shipped))
    assert kept.exit_code == 1 and "failed and cancelled flows while their record is kept" in kept.stderr
    for flow_id in sleeping:  # their retention ended: Redis dropped the records
        engine_side.engine.redis.delete(engine_side.engine.keys.flow(flow_id))
    again = {(row["kind"], row["version"]): row for row in json.loads(invoke("flows", "versions", "--json").stdout)["versions"]}
    assert again[("moto", REGISTRY["moto"].version)]["drained"] is True
    assert invoke("deploy", "check", "--manifest", str(shipped)).exit_code == 0, "drained: safe to drop"
    human = invoke("flows", "versions")
    assert human.exit_code == 0 and "drained" in human.stdout


def test_a_manifest_that_is_not_one_is_refused(cli_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kinds": 3}')
    result = invoke("deploy", "check", "--manifest", str(bad))
    assert result.exit_code == 2 and "durapay flows manifest --json" in result.stderr


def test_deploy_check_fails_and_names_the_schedules_a_build_leaves_without_their_kind(
    engine_side: Runtime, tmp_path: Path
) -> None:
    """A schedule whose charges' kind the build lacks fails the check, named (review 38, finding 11)."""
    from durapay.workflows.schedules import Schedules
    from tests.workflows.schedules.test_schedules import monthly

    schedules = Schedules(engine_side.engine)
    record = schedules.create(monthly(), key="dc-schedule")
    manifest = json.loads(invoke("flows", "manifest", "--json").stdout)
    del manifest["kinds"][schedules.flow_kind]
    shipped = tmp_path / "manifest.json"
    shipped.write_text(json.dumps(manifest))
    refused = invoke("deploy", "check", "--manifest", str(shipped))
    assert refused.exit_code == 1, refused.output
    assert f"1 schedules would be left with no code for their charges: {record.id}" in refused.stderr
    assert json.loads(invoke("deploy", "check", "--manifest", str(shipped), "--json").stdout)["stranded"] == [record.id]
