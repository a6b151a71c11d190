"""``durapay start`` and ``durapay schedules add`` refuse an identifier that looks like a card number
(an order id in the input, a customer or contract id, a ``--key``) with one line naming the field,
the number never whole; an ordinary numeric id is taken."""

from __future__ import annotations

import json

from tests.service.cli.conftest import invoke
from tests.service.cli.test_flows_cmd import moto, one_error_line

PAN = "4349940199004549"
REFUSAL = "looks like a card number; card data must not be used as an identifier"
SCHEDULE = ["schedules", "add", "--amount", "1500", "--description", "Gym", "--every", "month", "--day", "1"]


def test_start_refuses_a_card_number_as_an_order_id_or_key(cli_env: dict[str, str]) -> None:
    line = one_error_line(invoke("start", "moto", stdin=json.dumps(moto(f"ord-{PAN}"))))
    assert line.startswith("durapay: moto: order.orderId: " + REFUSAL) and PAN not in line
    refused = invoke("start", "moto", "--key", PAN, "--json", stdin=json.dumps(moto("ord-cli-ident")))
    assert refused.exit_code == 2
    error = json.loads(refused.stderr)
    assert (error["error"], error["field"]) == ("invalid_input", "key") and PAN not in refused.stderr
    assert invoke("flows", "ls", "--json").stdout.count('"id"') == 0, "nothing was started"
    taken = invoke("start", "moto", "--key", "1732660000000", "--json", stdin=json.dumps(moto("1732660000000")))
    assert taken.exit_code == 0, taken.output


def test_schedules_add_refuses_a_card_number_as_an_id_or_key(cli_env: dict[str, str]) -> None:
    assert "schedule: contractId: " + REFUSAL in one_error_line(invoke(*SCHEDULE, "--contract", PAN))
    assert "schedule: customerId: " + REFUSAL in one_error_line(invoke(*SCHEDULE, "--contract", "ct-1", "--customer", PAN))
    assert "schedule: key: " + REFUSAL in one_error_line(invoke(*SCHEDULE, "--contract", "ct-1", "--key", PAN))
    assert invoke(*SCHEDULE, "--contract", "ct-1", "--key", "gym-1732660000000").exit_code == 0
