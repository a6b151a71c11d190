"""``durapay start`` and ``durapay flows ls|show|signal|cancel|retry|kinds``; plus ``config`` and
``endpoints``. Operator errors are one line on stderr (a JSON object with ``--json``) and exit status 2;
``start --wait`` exits with the flow's outcome; lists keep ids whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durapay.service.runtime import Runtime
from durapay.tasks.outcomes import Advance, Attention, Finish, Outcome
from durapay.workflows.engine import Claim
from durapay.workflows.engine.states import FlowState
from tests.gateway.test_catalogue import SPEC, spec_file_pairs, spec_pairs
from tests.service.cli.conftest import invoke

CARD = {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"}
#: What makes rich draw tables as on a terminal of 100 columns (the CLI runner's stdout is not a terminal).
TERMINAL = {"TTY_COMPATIBLE": "1", "NO_COLOR": "1", "COLUMNS": "100"}


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
        (["start", "moto"], "{not json", "stdin is not valid JSON"),
        (["start", "moto"], "[1]", "must be a JSON object"),
        (["start", "moto", "--json-input", "/nonexistent/input.json"], None, "cannot read"),
        (["start", "moto", "--run-at", "soonish"], json.dumps(moto("o-late")), "expected a future time"),
        (["start", "moto", "--run-at", "2h"], json.dumps(moto("o-ago")), "write a delay as 'in 2h'"),
        (["start", "moto"], json.dumps({**moto("o-typo"), "captureTyp": "EXPLICIT"}), "did you mean `captureType`?"),
        (["start", "moto", "--tenant", "a b"], json.dumps(moto("o-tenant")), "tenant"),
    ],
)
def test_start_refusals_are_one_line(engine_side: Runtime, args: list[str], stdin: str | None, message: str) -> None:
    assert message in one_error_line(invoke(*args, stdin=stdin))


def test_start_with_a_tenant_keeps_it_on_the_flow(engine_side: Runtime) -> None:
    answer = invoke("start", "moto", "--tenant", "acme", "--json", stdin=json.dumps(moto("o-tenant-ok")))
    assert answer.exit_code == 0, answer.output
    assert engine_side.engine.get(json.loads(answer.output)["id"]).fields["tenant"] == "acme"
    shown = invoke("flows", "show", json.loads(answer.output)["id"])
    assert any(line.split() == ["tenant", "acme"] for line in shown.output.splitlines()), shown.output


def test_start_with_key_reused_for_another_input_is_refused(engine_side: Runtime) -> None:
    assert invoke("start", "moto", "--key", "k-2", stdin=json.dumps(moto("a"))).exit_code == 0
    assert "was used to start a different" in one_error_line(invoke("start", "moto", "--key", "k-2", stdin=json.dumps(moto("b"))))


def test_flows_ls_as_table_and_json_with_filters(engine_side: Runtime) -> None:
    ready = engine_side.engine.start("moto", moto("cli-ls-1")).id
    failed = failed_flow(engine_side, "cli-ls-2")
    table = invoke("flows", "ls", env=TERMINAL)
    assert table.exit_code == 0, table.output
    assert ready in table.stdout and failed in table.stdout and "flows (2); next: -" in table.stdout
    piped = invoke("flows", "ls")
    assert [line.split("\t")[:3] for line in piped.stdout.splitlines()] == [
        [failed, "refund", "failed"],
        [ready, "moto", "ready"],
    ], "piped: one tab-separated line per flow, newest first, no header"
    listed = json.loads(invoke("flows", "ls", "--state", "failed", "--json").stdout)
    assert [flow["id"] for flow in listed["flows"]] == [failed] and listed["next"] is None
    one = json.loads(invoke("flows", "ls", "--kind", "moto", "--since", "1h", "--limit", "1", "--json").stdout)
    assert one["flows"][0]["id"] == ready
    assert json.loads(invoke("flows", "ls", "--kind", "hpp", "--json").stdout) == {"flows": [], "limit": 50, "next": None}
    assert "unknown flow kind" in one_error_line(invoke("flows", "ls", "--kind", "nope"))
    assert invoke("flows", "ls", "--state", "bogus").exit_code == 2


def test_flows_ls_pages_by_the_cursor_it_prints(engine_side: Runtime) -> None:
    flows = [engine_side.engine.start("moto", moto(f"cli-page-{n}")).id for n in range(3)]
    first = json.loads(invoke("flows", "ls", "--limit", "2", "--json").stdout)
    assert len(first["flows"]) == 2 and first["next"]
    engine_side.engine.start("moto", moto("cli-page-new"))  # a start between pages shifts nothing
    rest = json.loads(invoke("flows", "ls", "--limit", "2", "--after", first["next"], "--json").stdout)
    assert sorted(flow["id"] for flow in first["flows"] + rest["flows"]) == sorted(flows) and rest["next"] is None
    piped = invoke("flows", "ls", "--limit", "1")
    assert len(piped.stdout.splitlines()) == 1 and piped.stderr.startswith("next: "), "the cursor on stderr, piped"
    table = invoke("flows", "ls", "--limit", "1", "--after", piped.stderr.split()[1], env=TERMINAL)
    assert "flows (1); next: " in table.stdout


def test_flows_show_with_history(engine_side: Runtime) -> None:
    flow_id = failed_flow(engine_side, "cli-show")
    table = invoke("flows", "show", flow_id)
    assert table.exit_code == 0, table.output
    assert "history" in table.stdout and "declined" in table.stdout
    version = engine_side.engine.registry[engine_side.engine.get(flow_id).kind].version
    assert f" {version}" in table.stdout, "the definition's version it started on"
    shown = json.loads(invoke("flows", "show", flow_id, "--json").stdout)
    assert shown["state"] == "failed" and shown["definition"]["version"] == version
    assert [entry["to"] for entry in shown["history"]] == ["ready", "running", "failed"]
    assert "no flow 'fnothere'" in one_error_line(invoke("flows", "show", "fnothere"))


def test_flows_signal(engine_side: Runtime) -> None:
    flow_id = engine_side.engine.start("three_steps", moto("cli-signal")).id
    result = invoke("flows", "signal", flow_id, "3ds_result", "--payload", '{"threeDSAuthResponse": "x"}')
    assert result.exit_code == 0, result.output
    assert "stored" in result.stdout
    as_json = json.loads(invoke("flows", "signal", flow_id, "3ds_result", "--json", "--payload", '{"PaRes": "y"}').stdout)
    assert as_json["result"] == "stored"
    assert "--payload: not JSON" in one_error_line(invoke("flows", "signal", flow_id, "x", "--payload", "{bad"))
    done = engine_side.engine.start("three_steps", moto("cli-signal-2"))
    claim = engine_side.engine.claim(done.id, done.step)
    assert isinstance(claim, Claim)
    engine_side.engine.complete(claim, Finish(False, "declined", error={"type": "PaymentDeclined"}))
    ended = invoke("flows", "signal", done.id, "3ds_result", "--payload", '{"threeDSAuthResponse": "x"}')
    assert "already ended" in one_error_line(ended)


def test_flows_signal_refuses_what_the_flow_does_not_take(engine_side: Runtime) -> None:
    """The engine's refusals reach the CLI as they are: no special code there (workflows.engine.signals)."""
    page = {"order": moto("cli-signal-3")["order"], "paymentSession": {"amount": "1500", "language": "ita"}}
    hpp = engine_side.engine.start("hpp", page).id
    three_steps = engine_side.engine.start("three_steps", moto("cli-signal-4")).id
    forged = '{"operation": {"orderId": "cli-signal-3", "operationId": "1", "operationResult": "EXECUTED"}}'
    refused = one_error_line(invoke("flows", "signal", hpp, "notification", "--payload", forged))
    assert "only through the notification receiver" in refused
    assert "takes no signal 'notification'" in one_error_line(invoke("flows", "signal", three_steps, "notification"))
    assert "did you mean `3ds_result`" in one_error_line(invoke("flows", "signal", three_steps, "3ds_reslt"))
    assert "foo: unknown field" in one_error_line(invoke("flows", "signal", three_steps, "3ds_result", "--payload", '{"foo": 1}'))
    as_json = invoke("flows", "signal", three_steps, "3ds_result", "--payload", '{"foo": 1}', "--json")
    assert as_json.exit_code == 2
    assert json.loads(as_json.stderr) == {
        "error": "invalid_input",
        "field": "foo",
        "reason": json.loads(as_json.stderr)["reason"],
    }
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
    if SPEC is not None:  # the interface description itself, not only the copy embedded in the tests
        assert pairs == spec_file_pairs(), f"as {SPEC} lists them"
    assert all(isinstance(row["idempotency_key"], bool) and row["operation"] for row in listed)


def test_redis_unreachable_is_one_line(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_REDIS_URL", "redis://127.0.0.1:9/0")
    assert "Redis unavailable" in one_error_line(invoke("flows", "ls"))


def test_a_bad_setting_is_one_line(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_ENGINE__LEASE_SECONDS", "long")
    assert "configuration error: DURAPAY_ENGINE__LEASE_SECONDS" in one_error_line(invoke("flows", "ls"))


# -- conventions of gh and kubectl: ids whole, exit statuses, JSON errors, completion ---------------


def lines_holding(text: str, value: str) -> list[str]:
    return [line for line in text.splitlines() if value in line]


@pytest.mark.parametrize("columns", ["80", "100"])
def test_flow_and_order_ids_are_never_cut_on_a_terminal(engine_side: Runtime, columns: str) -> None:
    """They were cut with an ellipsis at 80 and 100 columns, so they could not be pasted."""
    started = [engine_side.engine.start("reservation_setup", {"service": {"serviceName": "DISPUTELESS", "enabled": "Y"}}).id]
    started.append(engine_side.engine.start("moto", moto("order-id-eighteen-")).id)
    table = invoke("flows", "ls", env={**TERMINAL, "COLUMNS": columns})
    assert table.exit_code == 0, table.output
    for flow_id in started:
        assert len(lines_holding(table.stdout, flow_id)) == 1, table.stdout
    assert len(lines_holding(table.stdout, "order-id-eighteen-")) == 1, table.stdout
    assert not any(f"{flow_id[:-1]}…" in table.stdout for flow_id in started)


def test_the_money_column_is_never_cut_on_80_columns(engine_side: Runtime) -> None:
    """Issue 41 finding 6: at 80 columns ``flows ls`` cut the money first (``1,234…``, the currency lost).
    Descriptions are cut first, then the time is left out (said in the title); the amount stays whole."""
    engine_side.engine.start("reservation_setup", {"service": {"serviceName": "DISPUTELESS", "enabled": "Y"}})
    big = {"orderId": "order-id-eighteen-", "amount": "123456", "currency": "EUR"}
    paid = engine_side.engine.start("moto", {**moto("x"), "order": big}).id
    for columns in ("80", "100"):
        table = invoke("flows", "ls", env={**TERMINAL, "COLUMNS": columns})
        assert table.exit_code == 0, table.output
        [line] = lines_holding(table.stdout, paid)
        assert "1,234.56 EUR" in line and "order-id-eighteen-" in line, table.stdout
        assert all(len(text) <= int(columns) for text in table.stdout.splitlines()), table.stdout
    assert "updated not shown" in invoke("flows", "ls", env={**TERMINAL, "COLUMNS": "80"}).stdout


def finished(runtime: Runtime, key: str, outcome: Outcome) -> dict[str, Any]:
    """A moto flow started with ``key`` and ended by ``outcome`` (no worker involved); its input."""
    data = moto(key)
    record = runtime.engine.start("moto", data, key)
    claim = runtime.engine.claim(record.id, record.step)
    assert isinstance(claim, Claim)
    runtime.engine.complete(claim, outcome)
    return data


@pytest.mark.parametrize(
    ("outcome", "state", "status"),
    [
        (Finish(True, "paid"), "succeeded", 0),
        (Finish(False, "declined", error={"type": "PaymentDeclined", "responseCode": "116"}), "failed", 1),
        (Attention("the gateway cannot tell"), "needs_attention", 3),
    ],
)
def test_start_wait_exits_with_the_flows_outcome(engine_side: Runtime, outcome: Outcome, state: str, status: int) -> None:
    """``start --wait`` exited 0 for failed and needs_attention flows too."""
    data = finished(engine_side, f"w-{state}", outcome)
    result = invoke("start", "moto", "--key", f"w-{state}", "--wait", "10", "--json", stdin=json.dumps(data))
    assert (result.exit_code, json.loads(result.stdout)["state"]) == (status, state), result.output


def test_start_wait_that_runs_out_exits_4_and_shows_the_flow(engine_side: Runtime) -> None:
    result = invoke("start", "moto", "--wait", "0.3", "--json", stdin=json.dumps(moto("wait-out")))
    assert result.exit_code == 4, result.output
    assert json.loads(result.stdout)["state"] == "ready", "the flow as it stands, on stdout"
    error = json.loads(result.stderr.strip().splitlines()[-1])
    assert error["error"] == "timed_out" and "still ready at step pay" in error["reason"]


def test_start_wait_prints_the_customer_url_while_it_waits(engine_side: Runtime) -> None:
    """``start hpp --wait`` showed the hosted page's URL only once the flow had ended: nobody could pay."""
    session = {"actionType": "PAY", "amount": "900", "language": "eng", "resultUrl": "https://shop.example/ok"}
    data = {"order": {"orderId": "wait-hpp", "amount": "900", "currency": "EUR"}, "paymentSession": session}
    record = engine_side.engine.start("hpp", data, "wait-hpp")
    claim = engine_side.engine.claim(record.id, record.step)
    assert isinstance(claim, Claim)
    page = "https://gateway.example/hpp/wait-hpp"
    engine_side.engine.complete(claim, Advance({"hostedPage": page, "securityToken": "t"}))

    human = invoke("start", "hpp", "--key", "wait-hpp", "--wait", "0.3", stdin=json.dumps(data))
    assert human.exit_code == 4, human.output
    assert f"flow {record.id}: customer URL {page}" in human.stderr
    as_json = invoke("start", "hpp", "--key", "wait-hpp", "--wait", "0.3", "--json", stdin=json.dumps(data))
    announced = json.loads(as_json.stderr.splitlines()[0])
    assert announced == {"id": record.id, "state": "ready", "customer_url": page}


def test_errors_are_json_with_json(engine_side: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    def error_of(*args: str, stdin: str | None = None) -> dict[str, Any]:
        result = invoke(*args, "--json", stdin=stdin)
        assert result.exit_code == 2, result.output
        assert result.stdout == "", "nothing on stdout but results"
        [line] = result.stderr.strip().splitlines()
        return dict(json.loads(line))

    bad_amount = {"order": {"orderId": "o", "amount": "x", "currency": "EUR"}, "card": CARD}
    refused = error_of("start", "moto", stdin=json.dumps(bad_amount))
    assert (refused["error"], refused["field"]) == ("invalid_input", "order.amount")
    assert error_of("flows", "show", "fnothere") == {"error": "not_found", "reason": "no flow 'fnothere'"}
    assert error_of("flows", "ls", "--kind", "nope")["field"] == "--kind"
    assert error_of("flows", "ls", "--since", "soonish")["field"] == "--since"
    assert error_of("flows", "ls", "--after", "soon:f1")["field"] == "--after"
    usage = error_of("flows", "ls", "--state", "bogus")
    assert (usage["error"], usage["field"]) == ("invalid_input", "--state") and "bogus" in usage["reason"]
    assert error_of("schedules", "pause", "s000000000000") == {"error": "not_found", "reason": "no schedule 's000000000000'"}
    monkeypatch.setenv("DURAPAY_ENGINE__LEASE_SECONDS", "long")
    config = error_of("config")
    assert (config["error"], config["field"]) == ("configuration", "DURAPAY_ENGINE__LEASE_SECONDS")


def test_a_flow_error_is_one_readable_line_never_a_python_dict(engine_side: Runtime) -> None:
    error = {"type": "PaymentDeclined", "message": "operation 8001 ended DECLINED", "responseCode": "116",
             "responseText": "insufficient funds", "decline": "soft", "retryable": False}  # fmt: skip
    data = finished(engine_side, "shown-error", Finish(False, "declined", error=error))
    flow_id = engine_side.engine.start("moto", data, "shown-error").id
    shown = invoke("flows", "show", flow_id)
    assert shown.exit_code == 0, shown.output
    [line] = lines_holding(shown.stdout, "PaymentDeclined")
    assert line == ("error\tPaymentDeclined: operation 8001 ended DECLINED; response code 116 (insufficient funds, soft decline)")
    assert "{" not in shown.stdout and "'type'" not in shown.stdout


def test_every_command_takes_json() -> None:
    from typer import _click as click
    from typer.main import get_command

    from durapay.service.cli import build_app

    def leaves(command: Any, path: str) -> list[tuple[str, Any]]:
        if not hasattr(command, "list_commands"):
            return [(path, command)]
        context = click.Context(command)  # the root's commands load by name (service.cli.COMMAND_MODULES)
        children = [(name, command.get_command(context, name)) for name in command.list_commands(context)]
        return [leaf for name, child in children for leaf in leaves(child, f"{path} {name}")]

    missing = [path for path, command in leaves(get_command(build_app()), "durapay")
               if not any("--json" in param.opts for param in command.params)]  # fmt: skip
    assert missing == []


def test_shell_completion_is_installable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Typer guesses the shell from the process tree, which a CI runner may not have: name it instead.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    script = invoke("--show-completion", "bash")
    assert script.exit_code == 0, script.output
    assert "_DURAPAY_COMPLETE" in script.stdout and "complete" in script.stdout
    assert "--install-completion" in invoke("--help").stdout


def test_a_client_command_never_creates_an_empty_store(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``flows ls`` with no Redis configured started an embedded Valkey on a fresh folder and listed nothing."""
    monkeypatch.delenv("DURAPAY_REDIS_URL")
    monkeypatch.delenv("DURAPAY_BROKER_URL")
    data_dir = Path(cli_env["DURAPAY_DATA_DIR"])
    for args in (["flows", "ls"], ["schedules", "ls"], ["alive", "worker"]):
        line = one_error_line(invoke(*args))
        assert "no flow store: DURAPAY_REDIS_URL is not set and no embedded Valkey runs under" in line
    as_json = json.loads(invoke("flows", "ls", "--json").stderr)
    assert (as_json["error"], as_json["field"]) == ("configuration", "DURAPAY_REDIS_URL")
    assert not data_dir.exists(), "nothing created"


def test_start_on_a_terminal_with_no_input_says_what_it_expects(cli_env: dict[str, str]) -> None:
    """``durapay start moto`` with stdin a terminal waited for input without a word."""
    import os
    import pty
    import subprocess

    from tests.service.cli.conftest import DURAPAY

    primary, secondary = pty.openpty()
    try:
        done = subprocess.run(
            [*DURAPAY, "start", "moto"],
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=dict(os.environ),
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "durapay: --json-input: expected the moto flow's input as a JSON object on stdin, but stdin is a terminal: "
        "give a file (--json-input FILE) or pipe it (--json-input - < FILE)"
    )


def test_a_store_left_in_the_data_folder_is_read(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``durapay demo`` (its Valkey stopped) the folder holds a store: ``flows ls`` reads it."""
    import random

    from durapay.config import load_settings
    from durapay.config.embedded import EmbeddedValkey
    from durapay.service.runtime import build_runtime

    monkeypatch.delenv("DURAPAY_REDIS_URL")
    monkeypatch.delenv("DURAPAY_BROKER_URL")
    with EmbeddedValkey(Path(cli_env["DURAPAY_DATA_DIR"]) / "valkey", appendfsync="always") as left:
        built = build_runtime(load_settings(), redis_url=left.url, rng=random.Random(3))
        built.engine.sender = None
        flow_id = built.engine.start("moto", moto("left-behind")).id
        built.close()
    listed = invoke("flows", "ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert [flow["id"] for flow in json.loads(listed.stdout)["flows"]] == [flow_id]


def test_amounts_read_in_major_units_and_show_names_the_operation(engine_side: Runtime) -> None:
    """``flows show`` of a succeeded payment had no operation id and no amount (needed for a refund) but in
    ``--json``; lists showed none. People read 15.00 EUR; ``--json`` keeps the wire's minor units."""
    operation = {"operationId": "800123", "operationType": "PAYMENT", "operationAmount": "1500", "operationCurrency": "EUR"}
    data = finished(engine_side, "cli-money", Finish(True, "paid", output={"operation": operation}))
    [flow] = json.loads(invoke("flows", "ls", "--json").stdout)["flows"]
    shown = invoke("flows", "show", flow["id"]).stdout.splitlines()
    assert "operation\t800123 PAYMENT" in shown and "amount\t15.00 EUR" in shown, shown
    assert json.loads(invoke("flows", "show", flow["id"], "--json").stdout)["input"]["order"]["amount"] == "1500"
    assert data["order"]["amount"] == "1500"
    listed = invoke("flows", "ls").stdout.splitlines()
    assert listed[0].split("\t")[4] == "15.00 EUR", listed
    engine_side.engine.start("refund", {"operationId": "800123", "amount": 250, "currency": "JPY"})
    assert invoke("flows", "ls").stdout.splitlines()[0].split("\t")[4] == "250 JPY", "the currency's own decimals"


def test_a_misspelt_state_or_kind_names_the_closest(engine_side: Runtime) -> None:
    """``--state faild`` and unknown kinds got no "did you mean", unlike the API."""
    assert "did you mean `failed`?" in one_error_line(invoke("flows", "ls", "--state", "faild"))
    assert "did you mean `paybylink`?" in one_error_line(invoke("flows", "ls", "--kind", "paybylnk"))
    started = invoke("start", "motto", "--json", stdin=json.dumps(moto("cli-typo")))
    assert started.exit_code == 2
    error = json.loads(started.stderr)
    assert error["field"] == "kind" and "did you mean `moto`?" in error["reason"], error
    assert json.loads(invoke("flows", "ls", "--json").stdout)["flows"] == [], "nothing was started"


def test_a_kind_s_example_starts_as_it_is_printed(engine_side: Runtime) -> None:
    """Issue 41 finding 8: ``durapay flows kinds`` listed steps only. ``KIND --example`` prints an input
    that ``durapay start KIND`` takes as is (a fresh order each time); what to replace goes to stderr."""
    printed = [invoke("flows", "kinds", "moto", "--example") for _ in range(2)]
    assert all(result.exit_code == 0 and result.stderr == "" for result in printed), printed[0].output
    for result in printed:
        started = invoke("start", "moto", "--json", stdin=result.stdout)
        assert started.exit_code == 0, started.output
    refund = invoke("flows", "kinds", "refund", "--example")
    assert json.loads(refund.stdout)["operationId"] and "replace operationId" in refund.stderr
    assert invoke("flows", "kinds", "--example").exit_code == 2
    assert "did you mean `moto`" in one_error_line(invoke("flows", "kinds", "mot", "--example"))


def test_start_and_ls_name_a_terminal_and_a_removed_one_stops_a_writing_command(
    cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURAPAY_TERMINALS", '{"it": {"api_key": "key-of-it"}}')
    started = invoke("start", "moto", "--terminal", "it", "--json", stdin=json.dumps(moto("cli-term-1")))
    assert started.exit_code == 0, started.output
    view = json.loads(started.stdout)
    assert view["terminal"] == "it"
    shown = invoke("flows", "show", view["id"])
    assert any(line.split() == ["terminal", "it"] for line in shown.stdout.splitlines()), shown.stdout
    invoke("start", "moto", stdin=json.dumps(moto("cli-term-2")))
    listed = json.loads(invoke("flows", "ls", "--terminal", "it", "--json").stdout)
    assert [(flow["id"], flow["terminal"]) for flow in listed["flows"]] == [(view["id"], "it")]
    line = one_error_line(invoke("start", "moto", "--terminal", "fr", stdin=json.dumps(moto("cli-term-3"))))
    assert "unknown terminal 'fr'; known terminals: default, it" in line
    assert "--terminal" in one_error_line(invoke("flows", "ls", "--terminal", "fr"))
    monkeypatch.delenv("DURAPAY_TERMINALS")  # removed while its flow is in flight
    line = one_error_line(invoke("start", "moto", stdin=json.dumps(moto("cli-term-4"))))
    assert line.startswith("durapay: configuration error: DURAPAY_TERMINALS: terminal 'it': 1 flow in flight (moto 1)"), line
    assert invoke("flows", "ls").exit_code == 0, "a command that only reads still runs"
