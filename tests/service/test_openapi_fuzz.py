"""The OpenAPI document tells the truth: schemathesis generates requests from it (valid and invalid),
sends them to the app in process, and runs *every* one of its checks on the answers: no 5xx, every
status and header documented, every answer fitting its schema, valid input accepted, invalid input
refused, unsupported methods answered 405 with the right ``Allow``, the key required where declared.

Bounded and deterministic: a fixed number of examples per operation, a fixed seed, derandomized
generation (under a minute here; the coverage
phase, about 9,000 requests, is most of it). Flows started here never run (no worker).

One kind of answer is excused, narrowly: a 422 to schema-valid input whose reason is a rule that no
JSON schema can state (``SEMANTIC`` below: a time that must be in the future, a schedule that must
fire at least once, a signal the flow's *kind* does not take). Every other 422 to schema-valid input
is a failure: the document must say what the app refuses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from schemathesis.engine import events, from_schema

from durapay.gateway._money import AMOUNT_BOUNDS
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from tests.service.conftest import API_KEY, service_settings

EXAMPLES = 5
SEED = 20261123

#: Reasons of refusals that depend on the clock, on another field's value or on the stored flow.
SEMANTIC = (
    "is not in the future",  # ?run_at
    "never fire",  # a schedule whose end is before its first occurrence
    "never fires",
    "must not be before start",
    "takes no signal",  # a signal route on a flow of another kind
    "no step of this flow applies",  # an input whose options leave the flow nothing to do
    "is not a real date and time",  # a pattern knows no month lengths (2026-02-30)
    # An amount above the bound of its currency: the schema's maximum is the widest, and every amount's
    # description states each currency's (test_every_amount_states_the_bound_of_each_currency).
    "check for extra zeros",
    "delays count from the first decline",  # dunning delays must increase
    "the earlier path forms have no agency endpoints",  # reservation_setup: form and sections together
    "is not a valid cron expression",  # the cron grammar itself
    "DURAPAY_WEBHOOKS__ALLOW_PRIVATE",  # a webhook URL naming a private or loopback address, or http://
    "is not a valid host name",  # the DNS grammar of a webhook URL's host
    "has a port that is not a number",
    "before it starts",  # a reconciliation window: its end before its start
    "the window ends in the future",
    # The input boundary's rule for text (service.inbound, stated in the document's description): no
    # control character where a field cannot hold one, no lone surrogate; and numbers within 64 bits.
    "which this field cannot hold",
    "lone UTF-16 surrogate",
    "is out of range (integers within 64 bits",
)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: schemathesis.Case, response: schemathesis.Response) -> bool:
    """Keep every failure but a semantic 422 to schema-valid input (see the module's docstring)."""
    if type(failure).__name__ != "RejectedPositiveData" or response.status_code not in (400, 422):
        return True
    answer = response.json() or {}
    reason = str(answer.get("reason", "") if response.status_code == 422 else answer.get("error", ""))  # the receiver's 400
    return not any(rule in reason for rule in SEMANTIC)


#: Every answer of 500 or more, whatever the checks say: no input may reach one (issue 26).
SERVER_ERRORS: list[str] = []


@schemathesis.hook
def after_call(context: Any, case: schemathesis.Case, response: schemathesis.Response) -> None:
    if response.status_code >= 500:
        SERVER_ERRORS.append(f"{case.method} {case.formatted_path} {case.query} {case.body!r:.300} -> {response.text[:300]}")


@schemathesis.hook
def before_call(context: Any, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    """No worker runs here, so no customer URL ever comes: a start's ``?wait=`` would only sleep."""
    if case.query and "wait" in case.query:
        case.query["wait"] = 0


@pytest.fixture(scope="module")
def fuzzed_app(redis_url: str) -> Iterator[FastAPI]:
    settings = service_settings("fz" + uuid.uuid4().hex[:8], api={"start_wait_seconds": 0})
    built = build_runtime(settings, redis_url=redis_url)
    built.engine.sender = None
    for role in ("worker", "webhooks", "scheduler"):  # a deployment that is ready: /readyz answers 200
        built.engine.redis.set(built.engine.keys.heartbeat(role), "1", ex=3600)
    yield create_app(built)
    built.close()


def failures(app: FastAPI) -> list[str]:
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "headers": {"X-Api-Key": API_KEY},
            "generation": {"max-examples": EXAMPLES, "deterministic": True},
            "checks": {"enabled": True},
            # Not a check: link inference reads URLs out of 2xx bodies, and a generated "http://[" echoed
            # back in a flow's input makes it raise (urlsplit: Invalid IPv6 URL) and end the run.
            "phases": {"stateful": {"inference": {"algorithms": []}}},
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    found: list[str] = []
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is None:
                        continue
                    case = event.recorder.cases[case_id].value
                    response = event.recorder.find_response(case_id=case_id)
                    answer = f"{response.status_code} {response.text[:300]}" if response else "no response"
                    found.append(f"{check.name}: {case.method} {case.formatted_path} {case.query} {case.body!r:.300} -> {answer}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            found.append(f"error: {event.info}")
    return found


def test_the_api_answers_as_its_document_says(fuzzed_app: FastAPI) -> None:
    SERVER_ERRORS.clear()
    found = failures(fuzzed_app)
    assert not found, "\n".join(found)
    assert not SERVER_ERRORS, "\n".join(SERVER_ERRORS)


def test_every_amount_states_the_bound_of_each_currency(fuzzed_app: FastAPI) -> None:
    """The one 422 of an amount the schema allows (above its currency's bound) is stated in the
    description of every amount the document has: the fuzzer's excuse is documented, not hidden."""
    amounts: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            shapes = [one for one in node.get("anyOf", []) if isinstance(one, dict)]
            if any(str(one.get("pattern", "")).startswith("^0*[") for one in shapes):  # an amount's (gateway._money)
                amounts.append((path, str(node.get("description"))))
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for number, value in enumerate(node):
                walk(value, f"{path}[{number}]")

    walk(fuzzed_app.openapi(), "")
    assert len(amounts) > 10
    assert [path for path, description in amounts if description != AMOUNT_BOUNDS] == []
