"""``durapay start`` and ``durapay flows ls|show|signal|cancel|retry|kinds``; plus ``config`` and
``endpoints``. Operator errors are one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.runtime import Runtime
from tasks.outcomes import Finish
from tests.gateway.test_catalogue import SPEC, SPEC_FROM_ENV, spec_file_pairs, spec_pairs
from tests.service.cli.conftest import invoke
from workflows.engine import Claim
from workflows.states import FlowState

CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}


def moto(order_id: str) -> dict[str, Any]:
    return {"order": {"orderId": order_id, "amount": "1500", "currency": "EUR"}, "card": CARD}


def one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("durapay: "), result.stderr
    assert "Traceback" not in result.output
    return str(lines[0])


def failed_flow(runtime: Runtime, operation_id: str) -> str:
    """A refund flow that failed (its step claimed and completed with a refusal, no gateway involved)."""
    record = runtime.engine.start("refund", {"operationId": operation_id, "amount": 100, "currency": "EUR"})
    claim = runtime.engine.claim(record.id, record.step)
    assert isinstance(claim, Claim)
    runtime.engine.complete(claim, Finish(False, "declined", error={"type": "PaymentDeclined"}))
    return record.id


def test_start_from_a_file_and_from_stdin(engine_side: Runtime, tmp_path: Path) -> None:
    source = tmp_path / "moto.json"
    source.write_text(json.dumps(moto("cli-start-1")))
    result = invoke("start", "moto", "--json-input", str(source), "--key", "k-1", "--json")
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)
    assert (view["kind"], view["state"], view["order_id"]) == ("moto", "ready", "cli-start-1")
    assert view["input"]["card"]["pan"] == "434994******4549" and view["input"]["card"]["cvv"] == "***"
    again = invoke("start", "moto", "--json-input", str(source), "--key", "k-1", "--json")
    assert json.loads(again.stdout)["id"] == view["id"], "the same key starts nothing new"

    table = invoke("start", "moto", "--json-input", "-", stdin=json.dumps(moto("cli-start-2")))
    assert table.exit_code == 0, table.output
    assert "cli-start-2" in table.stdout and "ready" in table.stdout


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (
            ["start", "moto"],
            json.dumps({"order": {"orderId": "o", "amount": "x", "currency": "EUR"}, "card": CARD}),
            "order.amount",
        ),
        (["start", "nope"], "{}", "unknown flow kind"),
        (["start", "moto"], "{not json", "stdin is not JSON"),
        (["start", "moto"], "[1]", "must be a JSON object"),
        (["start", "moto", "--json-input", "/nonexistent/input.json"], None, "cannot read"),
        (["start", "moto", "--run-at", "soonish"], json.dumps(moto("o-late")), "expected a future time"),
        (["start", "moto", "--run-at", "2h"], json.dumps(moto("o-ago")), "write a delay as 'in 2h'"),
        (["start", "moto"], json.dumps({**moto("o-typo"), "captureTyp": "EXPLICIT"}), "did you mean `captureType`?"),
    ],
)
def test_start_refusals_are_one_line(engine_side: Runtime, args: list[str], stdin: str | None, message: str) -> None:
    assert message in one_error_line(invoke(*args, stdin=stdin))


def test_start_with_key_reused_for_another_input_is_refused(engine_side: Runtime) -> None:
    assert invoke("start", "moto", "--key", "k-2", stdin=json.dumps(moto("a"))).exit_code == 0
    assert "was used to start a different" in one_error_line(invoke("start", "moto", "--key", "k-2", stdin=json.dumps(moto("b"))))


def test_flows_ls_as_table_and_json_with_filters(engine_side: Runtime) -> None:
    ready = engine_side.engine.start("moto", moto("cli-ls-1")).id
    failed = failed_flow(engine_side, "cli-ls-2")
    table = invoke("flows", "ls")
    assert table.exit_code == 0, table.output
    assert ready in table.stdout and failed in table.stdout and "flows (2)" in table.stdout
    listed = json.loads(invoke("flows", "ls", "--state", "failed", "--json").stdout)
    assert [flow["id"] for flow in listed] == [failed]
    assert json.loads(invoke("flows", "ls", "--kind", "moto", "--since", "1h", "--limit", "1", "--json").stdout)[0]["id"] == ready
    assert json.loads(invoke("flows", "ls", "--kind", "hpp", "--json").stdout) == []
    assert "unknown flow kind" in one_error_line(invoke("flows", "ls", "--kind", "nope"))
    assert invoke("flows", "ls", "--state", "bogus").exit_code == 2


def test_flows_show_with_history(engine_side: Runtime) -> None:
    flow_id = failed_flow(engine_side, "cli-show")
    table = invoke("flows", "show", flow_id)
    assert table.exit_code == 0, table.output
    assert "history" in table.stdout and "declined" in table.stdout
    shown = json.loads(invoke("flows", "show", flow_id, "--json").stdout)
    assert shown["state"] == "failed"
    assert [entry["to"] for entry in shown["history"]] == ["ready", "running", "failed"]
    assert "no flow 'fnothere'" in one_error_line(invoke("flows", "show", "fnothere"))


def test_flows_signal(engine_side: Runtime) -> None:
    flow_id = engine_side.engine.start("three_steps", moto("cli-signal")).id
    result = invoke("flows", "signal", flow_id, "3ds_result", "--payload", '{"threeDSAuthResponse": "x"}')
    assert result.exit_code == 0, result.output
    assert "stored" in result.stdout
    as_json = json.loads(invoke("flows", "signal", flow_id, "3ds_result", "--json", "--payload", '{"PaRes": "y"}').stdout)
    assert as_json["result"] == "stored"
    assert "--payload is not JSON" in one_error_line(invoke("flows", "signal", flow_id, "x", "--payload", "{bad"))
    done = engine_side.engine.start("three_steps", moto("cli-signal-2"))
    claim = engine_side.engine.claim(done.id, done.step)
    assert isinstance(claim, Claim)
    engine_side.engine.complete(claim, Finish(False, "declined", error={"type": "PaymentDeclined"}))
    ended = invoke("flows", "signal", done.id, "3ds_result", "--payload", '{"threeDSAuthResponse": "x"}')
    assert "already ended" in one_error_line(ended)


def test_flows_signal_refuses_what_the_flow_does_not_take(engine_side: Runtime) -> None:
    """The engine's refusals reach the CLI as they are: no special code there (workflows.signals)."""
    page = {"order": moto("cli-signal-3")["order"], "paymentSession": {"amount": "1500", "language": "ita"}}
    hpp = engine_side.engine.start("hpp", page).id
    three_steps = engine_side.engine.start("three_steps", moto("cli-signal-4")).id
    forged = '{"operation": {"orderId": "cli-signal-3", "operationId": "1", "operationResult": "EXECUTED"}}'
    refused = one_error_line(invoke("flows", "signal", hpp, "notification", "--payload", forged))
    assert "only through the notification receiver" in refused
    assert "takes no signal 'notification'" in one_error_line(invoke("flows", "signal", three_steps, "notification"))
    assert "did you mean `3ds_result`" in one_error_line(invoke("flows", "signal", three_steps, "3ds_reslt"))
    assert "foo: unknown field" in one_error_line(invoke("flows", "signal", three_steps, "3ds_result", "--payload", '{"foo": 1}'))
    assert all(entry["what"] != "signal notification" for entry in engine_side.engine.history(hpp)), "nothing was stored"
    assert all(entry["what"] != "signal 3ds_result" for entry in engine_side.engine.history(three_steps))


def test_flows_cancel_and_retry(engine_side: Runtime) -> None:
    flow_id = engine_side.engine.start("moto", moto("cli-cancel")).id
    result = invoke("flows", "cancel", flow_id, "--reason", "customer called")
    assert result.exit_code == 0, result.output
    assert f"{flow_id}: cancelled" in result.stdout
    assert "already ended" in one_error_line(invoke("flows", "cancel", flow_id))
    assert "only failed or needs_attention" in one_error_line(invoke("flows", "retry", flow_id))

    failed = failed_flow(engine_side, "cli-retry")
    retried = json.loads(invoke("flows", "retry", failed, "--json").stdout)
    assert (retried["state"], retried["step"]) == ("ready", "post")
    assert engine_side.engine.get(failed).state is FlowState.READY


def test_flows_kinds_config_and_endpoints(cli_env: dict[str, str]) -> None:
    kinds = json.loads(invoke("flows", "kinds", "--json").stdout)
    assert {"moto", "hpp", "three_steps", "refund"} <= {row["kind"] for row in kinds}
    assert "three_steps" in invoke("flows", "kinds").stdout
    config = json.loads(invoke("config", "--json").stdout)
    assert config["DURAPAY_API__KEY"] == "(set)"
    assert config["DURAPAY_RECEIVER__PATH"] == "/notifications"
    listed = json.loads(invoke("endpoints", "--json").stdout)
    pairs = [(row["method"], row["path"]) for row in listed]
    assert len(pairs) == 83 == len(set(pairs)), "every method and path of the spec, each once"
    assert pairs == spec_pairs(), "in the spec's order"
    if SPEC_FROM_ENV or SPEC.exists():  # the spec file itself, not only the copy embedded in the tests
        assert pairs == spec_file_pairs(), f"as {SPEC} lists them"
    assert all(isinstance(row["idempotency_key"], bool) and row["operation"] for row in listed)


def test_redis_unreachable_is_one_line(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_REDIS_URL", "redis://127.0.0.1:9/0")
    assert "Redis unavailable" in one_error_line(invoke("flows", "ls"))


def test_a_bad_setting_is_one_line(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_ENGINE__LEASE_SECONDS", "long")
    assert "configuration error: DURAPAY_ENGINE__LEASE_SECONDS" in one_error_line(invoke("flows", "ls"))
