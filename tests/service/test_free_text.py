"""The card-number boundary in text, enumerated from the OpenAPI document: every string field of every
route's body, every path, query and header parameter, gets a card number, and no answer repeats it,
no view shows it, and (for an operator's text: a reason, a name, a description, a filter) nothing in
Redis keeps it: free text is masked where it is written, not where it is shown (issue 37, findings 5
and 6). A field or route added later is enumerated too; a route with a body that no table below gives a
valid body for fails the test until it is given one.

The fields of a flow's input (and a signal's, a schedule's) are the merchant's request to the gateway:
kept as given while the flow runs (the gateway gets them), masked wherever they are shown, scrubbed once
the flow ends (``workflows.engine.sensitive.scrub``; tests/service/test_card_masking.py runs it end to end).
Their enumeration here proves the rule that shows them: every string field of every kind's input,
masked by ``mask`` unless it is an identifier, and every identifier refused when it looks like a card
number, except the ids the gateway assigns (docs/security.md)."""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durapay.service.runtime import Runtime
from durapay.workflows.engine.sensitive import GATEWAY_IDS, CardIdentifier, identifier, mask, refuse_card_identifiers
from tests.service.conftest import API_KEY, Served, service_runtime, waiting_flow
from tests.service.test_api_schedules import schedule
from tests.service.test_card_masking import stored

KEY = {"X-Api-Key": API_KEY}
PAN = "4349940199004549"
TEXT = f"card {PAN} read out by the customer"
#: The bodies of the flows' own routes (a flow kind's input is the gateway's request: see the docstring).
FLOW_START = re.compile(r"^/flows/[a-z_]+$")


@pytest.fixture
def runtime(own_redis_url: str, key_prefix: str) -> Iterator[Runtime]:
    """On a Valkey of this file's own: the test reads the whole store after each request."""
    yield from service_runtime(own_redis_url, key_prefix)


def resolved(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def leaves(
    schema: dict[str, Any], doc: dict[str, Any], path: tuple[str | int, ...] = (), depth: int = 0
) -> Iterator[tuple[str | int, ...]]:
    """The paths of every string a body of ``schema`` may hold: properties, a list's first item, a free
    object's key (``note``), the branches of ``anyOf``/``oneOf``/``allOf``."""
    schema = resolved(schema, doc)
    if depth > 8:
        return
    for branch in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(branch, []):
            yield from leaves(option, doc, path, depth + 1)
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds:
        yield path
    if "object" in kinds or "properties" in schema:
        for name, inner in schema.get("properties", {}).items():
            yield from leaves(inner, doc, (*path, name), depth + 1)
        extra = schema.get("additionalProperties")
        if extra is True or (isinstance(extra, dict) and extra != {}) or (extra == {} and path):
            yield (*path, "note")
    if "array" in kinds:
        yield from leaves(schema.get("items", {}), doc, (*path, 0), depth + 1)


def placed(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """A copy of ``body`` with ``value`` at ``path`` (objects and lists made on the way)."""
    whole = copy.deepcopy(body) if body is not None else {}
    holder = whole
    for step, following in itertools.pairwise(path):
        if isinstance(holder, list):
            while len(holder) <= int(step):
                holder.append({} if isinstance(following, str) else [])
            if not isinstance(holder[int(step)], dict | list):
                holder[int(step)] = {} if isinstance(following, str) else []
            holder = holder[int(step)]
        else:
            if not isinstance(holder.get(step), dict | list):
                holder[step] = {} if isinstance(following, str) else []
            holder = holder[step]
    last = path[-1]
    if isinstance(holder, list):
        while len(holder) <= int(last):
            holder.append(None)
        holder[int(last)] = value
    else:
        holder[last] = value
    return whole


def body_schema(operation: dict[str, Any]) -> dict[str, Any] | None:
    content = (operation.get("requestBody") or {}).get("content") or {}
    return (content.get("application/json") or {}).get("schema")


def whole_in(text: str) -> bool:
    return PAN in text or PAN in re.sub(r"[ -]", "", text)


def redis_holding_it(served: Served) -> list[str]:
    engine = served.engine
    return [
        key.decode()
        for key in engine.redis.scan_iter(match=engine.keys.prefix + "*")
        if PAN in key.decode(errors="replace") or PAN in repr(stored(engine.redis, key))
    ]


# -- what each route needs to take a body ----------------------------------------------------------------


def a_flow(served: Served) -> dict[str, str]:
    return {"flow_id": waiting_flow(served.engine, f"ord-ft-{len(served.engine.list(limit=500))}", "tok")}


def a_schedule(served: Served) -> dict[str, str]:
    created = served.http.post("/schedules", json=schedule(), headers=KEY)
    assert created.status_code == 201, created.text
    return {"schedule_id": created.json()["id"]}


def a_pause(served: Served) -> dict[str, str]:
    served.engine.pauses.pause("notified", "maintenance", by="test")
    return {"kind": "notified"}


def no_pause(served: Served) -> dict[str, str]:
    for kind in served.engine.pauses.paused():
        served.engine.pauses.resume(kind, by="test")
    return {"kind": "notified"}


Setup = Callable[[Served], dict[str, str]]
#: An operator's text: (a valid body, what the route acts on). Masked where it is written: Redis keeps none.
OPERATOR: dict[tuple[str, str], tuple[dict[str, Any], Setup]] = {
    ("post", "/flows/{flow_id}/cancel"): ({"reason": "customer asked"}, a_flow),
    ("post", "/flows/{flow_id}/refund-late-payment"): ({"reason": "refunded"}, a_flow),
    ("post", "/schedules/{schedule_id}/cancel"): ({"reason": "customer left"}, a_schedule),
    ("post", "/schedules/{schedule_id}/resolve"): ({"occurrence": "2031-01-31T00:00:00Z", "outcome": "charged"}, a_schedule),
    ("patch", "/schedules/{schedule_id}"): ({"amount": 2000}, a_schedule),
    ("post", "/webhooks"): ({"url": "https://hooks.example.com/durapay", "description": "shop"}, lambda served: {}),
    ("post", "/events/replay"): ({}, lambda served: {}),
    ("post", "/reconciliation/reports"): ({"since": "1h"}, lambda served: {}),
    ("post", "/kinds/{kind}/pause"): ({"reason": "maintenance", "by": "ann"}, no_pause),
    ("post", "/kinds/{kind}/resume"): ({"by": "ann"}, a_pause),
    ("post", "/bulk/dry-run"): ({"action": "retry"}, lambda served: {}),
    ("post", "/bulk"): ({"action": "retry", "by": "ann"}, lambda served: {}),
}
#: A merchant's request carried by a flow (a signal, a schedule's charges): shown masked, never echoed.
MERCHANT: dict[tuple[str, str], tuple[dict[str, Any], Setup]] = {
    ("post", "/schedules"): (schedule(), lambda served: {}),
    ("post", "/flows/{flow_id}/signals/3ds_result"): ({"threeDSAuthResponse": "ok"}, a_flow),
    ("post", "/flows/{flow_id}/signals/form_completed"): ({}, a_flow),
    ("post", "/flows/{flow_id}/signals/link_changed"): ({}, a_flow),
    ("post", "/flows/{flow_id}/signals/paid"): ({}, a_flow),  # the test kind's (tests/service/conftest.py)
}


def views(served: Served, doc: dict[str, Any], ids: dict[str, str], *, lists: bool) -> dict[str, str]:
    """The GETs of the document that name one of ``ids`` (``lists``: also those that name none: the
    lists, read once they hold everything written), answered."""
    shown: dict[str, str] = {}
    for path, operations in doc["paths"].items():
        names = re.findall(r"{(\w+)}", path)
        if "get" not in operations or any(name not in ids for name in names) or (not names and not lists):
            continue
        url = path.format(**ids)
        shown[url] = served.http.get(url, headers=KEY).text
    return shown


def test_every_route_with_a_body_is_enumerated(served: Served, api_document: dict[str, Any]) -> None:
    doc = api_document
    with_body = {
        (method, path)
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
        if body_schema(operation) is not None and path != "/notifications" and not FLOW_START.match(path)
    }
    assert with_body == set(OPERATOR) | set(MERCHANT), "give the new route a valid body in OPERATOR or MERCHANT"


def test_an_operators_text_is_masked_where_it_is_written(served: Served, api_document: dict[str, Any]) -> None:
    for route in sorted(OPERATOR):
        operators_text(served, api_document, route)


def operators_text(served: Served, doc: dict[str, Any], route: tuple[str, str]) -> None:
    method, path = route
    base, setup = OPERATOR[route]
    fields = sorted(set(leaves(body_schema(doc["paths"][path][method]) or {}, doc)), key=str)
    assert fields, f"{method} {path}: no string field found"
    for field in fields:
        for value in (TEXT, PAN):
            ids = setup(served)
            answer = served.http.request(method.upper(), path.format(**ids), json=placed(base, field, value), headers=KEY)
            where = f"{method} {path} with {'.'.join(map(str, field))}={value!r}"
            assert answer.status_code < 500, (where, answer.text)
            assert not whole_in(answer.text), f"{where}: answered whole: {answer.text}"
            assert redis_holding_it(served) == [], f"{where}: written whole"
            ids |= {"endpoint_id": answer.json().get("id", "")} if path == "/webhooks" and answer.status_code == 201 else {}
            for url, text in views(served, doc, ids, lists=False).items():
                assert not whole_in(text), f"{where}: GET {url} shows it whole"
    for url, text in views(served, doc, {}, lists=True).items():
        assert not whole_in(text), f"{method} {path}: GET {url} shows it whole"


def test_a_merchants_request_is_never_echoed_or_shown_whole(served: Served, api_document: dict[str, Any]) -> None:
    for route in sorted(MERCHANT):
        merchants_request(served, api_document, route)


def merchants_request(served: Served, doc: dict[str, Any], route: tuple[str, str]) -> None:
    method, path = route
    base, setup = MERCHANT[route]
    for field in sorted(set(leaves(body_schema(doc["paths"][path][method]) or {}, doc)), key=str) or [("note",)]:
        ids = setup(served)
        answer = served.http.request(method.upper(), path.format(**ids), json=placed(base, field, TEXT), headers=KEY)
        where = f"{method} {path} with {'.'.join(map(str, field))}"
        assert answer.status_code < 500, (where, answer.text)
        assert not whole_in(answer.text), f"{where}: answered whole: {answer.text}"
        if path == "/schedules" and answer.status_code == 201:
            ids["schedule_id"] = answer.json()["id"]
        for url, text in views(served, doc, ids, lists=False).items():
            assert not whole_in(text), f"{where}: GET {url} shows it whole"
    for url, text in views(served, doc, {}, lists=True).items():
        assert not whole_in(text), f"{method} {path}: GET {url} shows it whole"


def test_every_field_of_every_flow_input_is_shown_masked_or_refused(served: Served, api_document: dict[str, Any]) -> None:
    """The rule that shows a flow's input, proved on every string field of every kind's input schema."""
    doc = api_document
    starts = [path for path in doc["paths"] if FLOW_START.match(path) and "post" in doc["paths"][path]]
    assert len(starts) == len(served.engine.registry)
    checked = 0
    for path in starts:
        for field in set(leaves(body_schema(doc["paths"][path]["post"]) or {}, doc)):
            data = placed({}, field, TEXT)
            named = [str(step) for step in field if isinstance(step, str)]
            last = named[-1] if named else ""
            open_keys = "passThrough" in named
            if identifier(last) and (open_keys or last not in GATEWAY_IDS):
                with pytest.raises(CardIdentifier):
                    refuse_card_identifiers(data)
            elif identifier(last):
                assert json.dumps(mask(data)).count(PAN) == 1, "a gateway's id: shown whole, as docs/security.md says"
            else:
                assert not whole_in(json.dumps(mask(data))), f"{path} {field}"
            checked += 1
    assert checked > 100


# -- error answers never repeat it (finding 6) ------------------------------------------------------------------


def test_no_error_answer_repeats_a_card_number(served: Served, api_document: dict[str, Any]) -> None:
    """Every path, query and header parameter of every route, a body's unknown field named by one, and the
    fields whose refusals quote their value (a currency, a capture type, a kind, a filter)."""
    doc = api_document
    flow = a_flow(served)["flow_id"]
    answers: dict[str, str] = {}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            fill = {
                p["name"]: flow if p["name"] == "flow_id" else "notified" if p["name"] == "kind" else "x1"
                for p in parameters
                if p["in"] == "path"
            }
            for parameter in parameters:
                url, query, headers = path, {}, dict(KEY)
                if parameter["in"] == "path":
                    url = path.format(**(fill | {parameter["name"]: PAN}))
                else:
                    url = path.format(**fill)
                    if parameter["in"] == "query":
                        query = {parameter["name"]: PAN}
                    elif parameter["in"] == "header":
                        headers[parameter["name"]] = PAN
                body = {} if body_schema(operation) is not None else None
                answer = served.http.request(method.upper(), url, params=query, json=body, headers=headers)
                answers[f"{method} {path} {parameter['in']}.{parameter['name']}"] = f"{answer.status_code} {answer.text}"
            if body_schema(operation) is not None:
                answer = served.http.request(method.upper(), path.format(**fill), json={PAN: PAN}, headers=KEY)
                answers[f"{method} {path} body.{PAN[:6]}"] = f"{answer.status_code} {answer.text}"
    moto = {
        "order": {"orderId": "ord-echo", "amount": "100", "currency": "EUR"},
        "card": {"pan": PAN, "expiryDate": "1230", "cvv": "1"},
    }
    answers["order.currency"] = served.http.post(
        "/flows/moto?wait=0", json=placed(moto, ("order", "currency"), PAN), headers=KEY
    ).text
    answers["captureType"] = served.http.post("/flows/moto?wait=0", json=moto | {"captureType": PAN}, headers=KEY).text
    answers["bulk filter"] = served.http.post("/bulk/dry-run", json={"action": "retry", "error": PAN}, headers=KEY).text
    answers["/notifications"] = served.http.post("/notifications", json={"eventId": PAN, "operation": {"orderId": PAN}}).text
    assert len(answers) > 100
    repeated = {where: text for where, text in answers.items() if whole_in(text)}
    assert repeated == {}
    assert all(not text.startswith("5") for text in answers.values()), [w for w, t in answers.items() if t.startswith("5")]
