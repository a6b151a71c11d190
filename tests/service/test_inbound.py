"""The one input boundary (``service.inbound``) over real HTTP: UTF-8 JSON only, the depth counted on
the decoded text, no lone surrogate, no control character where a field cannot hold one, no number out
of range, on every door: the control API, the console's forms, the path, the query, the headers the
application reads, and the open notification receiver, which reads at most its own limit.

Issue 37, findings 1, 2 and 7: a ``"\\ud800"`` in a notification was a 500 on the open path; a UTF-16
body hid its nesting from a scan of its bytes (500, "Maximum serialization depth exceeded"); the
receiver's body was read up to the API's 1 MiB before its own 64 KiB limit, and that 413 not counted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Message

from durapay.service.app import create_app
from durapay.service.inbound import HEADERS, MAX_DEPTH, Refusal, decode_form, decode_json, too_deep
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from tests.service.conftest import API_KEY, NOTIFIED, Served, notification, service_settings, waiting_flow

KEY = {"X-Api-Key": API_KEY, "Content-Type": "application/json"}
TOKEN = "2f0ea5059b41414ca3744fe672327d85"
SURROGATE = "holds a lone UTF-16 surrogate (an escape such as \\ud800 with no pair): not Unicode text"


def moto(order_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "order": {"orderId": order_id, "amount": "1500", "currency": "EUR"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
        **extra,
    }


def nothing_written(served: Served) -> bool:
    return served.engine.list(limit=10) == []


@pytest.fixture(scope="module")
def door(redis_url: str) -> Iterator[Served]:
    """One app for the refusals (they write nothing, which each checks): started once for the module."""
    built = build_runtime(service_settings("inb" + uuid.uuid4().hex[:8]), redis_url=redis_url, flows={"notified": NOTIFIED})
    built.engine.sender = None
    with ApiServer(create_app(built)) as server, httpx.Client(base_url=server.url, timeout=10.0) as http:
        yield Served(built, server, http)
    built.close()


# -- encodings (finding 2) -------------------------------------------------------------------------------


def hidden_depth(order_id: str) -> str:
    """A moto body whose ``passThrough.deep`` nests 300 lists, between two strings holding U+2200 ("∀"),
    whose UTF-16 and UTF-32 forms carry a ``"`` byte: a scan of the bytes as ASCII saw the brackets as text."""
    body = moto(order_id, passThrough={"note": "∀", "deep": "LISTS", "z": "∀"})
    return json.dumps(body, ensure_ascii=False).replace('"LISTS"', "[" * 300 + "]" * 300)


@pytest.mark.parametrize(
    ("codec", "named"),
    [("utf-16-le", "UTF-16 (little-endian)"), ("utf-16-be", "UTF-16 (big-endian)"), ("utf-32-be", "UTF-32 (big-endian)")],
)
def test_a_wide_body_cannot_hide_its_depth_and_is_refused_naming_its_encoding(door: Served, codec: str, named: str) -> None:
    answer = door.http.post("/flows/moto?wait=0", content=hidden_depth("hidden").encode(codec), headers=KEY)
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"] == "unsupported_encoding"
    assert named in answer.json()["reason"] and "RFC 8259" in answer.json()["reason"]
    assert nothing_written(door)


@pytest.mark.parametrize(
    ("raw", "content_type", "named"),
    [
        (b"\xef\xbb\xbf" + json.dumps(moto("bom8")).encode(), "application/json", "UTF-8 with a byte order mark"),
        (json.dumps(moto("bom16")).encode("utf-16"), "application/json", "UTF-16 (little-endian, with a byte order mark)"),
        (json.dumps(moto("bom32")).encode("utf-32"), "application/json", "UTF-32 (little-endian, with a byte order mark)"),
        (json.dumps(moto("latin")).encode(), "application/json; charset=iso-8859-1", "charset=iso-8859-1"),
        (json.dumps(moto("caf\xe9"), ensure_ascii=False).encode("latin-1"), "application/json", "not UTF-8 (byte 0xe9"),
    ],
)
def test_a_body_that_is_not_utf8_is_refused_naming_what_it_is(door: Served, raw: bytes, content_type: str, named: str) -> None:
    answer = door.http.post("/flows/moto?wait=0", content=raw, headers={**KEY, "Content-Type": content_type})
    assert (answer.status_code, answer.json()["error"]) == (415, "unsupported_encoding"), answer.text
    assert named in answer.json()["reason"]
    assert nothing_written(door)


def test_a_body_of_another_media_type_is_refused(door: Served) -> None:
    plain = {**KEY, "Content-Type": "text/plain"}
    answer = door.http.post("/flows/moto?wait=0", content=json.dumps(moto("plain")), headers=plain)
    assert (answer.status_code, answer.json()["error"]) == (415, "unsupported_media_type"), answer.text
    assert nothing_written(door)


# -- text and numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ('{"passThrough": {"note": "\\ud800"}}', "passThrough.note", "lone UTF-16 surrogate"),
        ('{"passThrough": {"\\udfff": "x"}}', "passThrough.\\udfff", "lone UTF-16 surrogate"),
        ('{"passThrough": {"note": "a\\u0000b"}}', "passThrough.note", "U+0000"),
        ('{"passThrough": {"a\\u0000": "b"}}', "passThrough.a\\u0000", "U+0000"),
        ('{"passThrough": {"basketId": "b\\n1"}}', "passThrough.basketId", "U+000A"),
        ('{"passThrough": {"note": "\\u009b"}}', "passThrough.note", "U+009B"),
        ('{"passThrough": {"x": NaN}}', "(body)", "NaN is not a JSON number"),
        ('{"passThrough": {"x": 1e999}}', "passThrough.x", "out of range"),
        ('{"passThrough": {"x": -Infinity}}', "(body)", "-Infinity is not a JSON number"),
        ('{"passThrough": {"x": [1, 9223372036854775808]}}', "passThrough.x.1", "out of range"),
        ('{"passThrough": {"x": 1' + "0" * 5000 + "}}", "passThrough.x", "out of range"),
    ],
)
def test_text_that_is_not_text_and_numbers_out_of_range_are_refused_naming_the_field(
    door: Served, body: str, field: str, reason: str
) -> None:
    whole = json.dumps(moto("text")).removesuffix("}") + ", " + body.removeprefix("{")
    answer = door.http.post("/flows/moto?wait=0", content=whole.encode(), headers=KEY)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert reason in answer.json()["reason"]
    assert nothing_written(door)


def test_free_text_keeps_its_tabs_and_line_breaks(served: Served) -> None:
    body = moto("lines", passThrough={"note": "first line\r\nsecond\tline"})
    answer = served.http.post("/flows/moto?wait=0", json=body, headers={"X-Api-Key": API_KEY})
    assert answer.status_code == 201, answer.text
    assert served.engine.get(answer.json()["id"]).input["passThrough"]["note"] == "first line\r\nsecond\tline"


# -- path, query, headers, forms ---------------------------------------------------------------------------


def test_path_query_and_the_headers_read_are_text(door: Served) -> None:
    refusals = {
        "(path)": door.http.get("/flows/f%ff", headers=KEY),
        "(path) ": door.http.get("/flows/f%00", headers=KEY),
        "query.state": door.http.get("/flows?state=%ff", headers=KEY),
        "query.kind": door.http.get("/flows?kind=mo%01to", headers=KEY),
        "header.Idempotency-Key": door.http.post(
            "/flows/moto?wait=0", json=moto("latin-key"), headers=[("X-Api-Key", API_KEY), ("Idempotency-Key", b"caf\xe9")]
        ),
    }
    for field, answer in refusals.items():
        assert answer.status_code == 422, (field, answer.text)
        assert answer.json()["field"] == field.strip(), answer.text
    assert nothing_written(door)


def test_every_header_the_api_declares_is_decoded_at_the_boundary(api_document: dict[str, Any]) -> None:
    """Derived from the OpenAPI document: a new header parameter is covered, or this fails."""
    declared = {
        parameter["name"].lower()
        for operations in api_document["paths"].values()
        for operation in operations.values()
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "header"
    }
    assert declared and declared <= set(HEADERS)


def test_a_console_form_is_decoded_at_the_boundary(door: Served) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    refused = door.http.post("/console/login", content=b"key=%ff%fe&csrf=x", headers=form)
    assert (refused.status_code, refused.json()["field"]) == (422, "key"), refused.text
    control = door.http.post("/console/login", content=b"key=a%00&csrf=x", headers=form)
    assert (control.status_code, control.json()["field"]) == (422, "key"), control.text
    assert decode_form(b"reason=two%0D%0Alines&by=ann") == {"reason": "two\r\nlines", "by": "ann"}


# -- the open receiver (findings 1 and 7) ---------------------------------------------------------------------


def test_a_lone_surrogate_in_a_notification_is_400_never_500(served: Served) -> None:
    """Finding 1: a ``"\\ud800"`` in ``orderId``, ``operationId``, ``securityToken`` or ``eventId`` was a 500
    (UnicodeEncodeError where the order id and the token were encoded), with or without the right token."""
    waiting_flow(served.engine, "ord-sur", TOKEN)
    refused = 0
    for token in (TOKEN, "not-the-token"):
        for field in ("orderId", "operationId", "securityToken", "eventId"):
            body = notification("ord-sur", token)
            holder = body["operation"] if field in ("orderId", "operationId") else body
            holder[field] = "x\ud800"
            raw = json.dumps(body).encode()  # ensure_ascii: the escape \ud800, as a client sends it
            answer = served.http.post("/notifications", content=raw, headers={"Content-Type": "application/json"})
            named = f"operation.{field}" if field in ("orderId", "operationId") else field
            assert (answer.status_code, answer.json()) == (400, {"outcome": "KO", "error": f"{named}: {SURROGATE}"}), (
                field,
                token,
                answer.text,
            )
            refused += 1
            assert served.counter("malformed") == refused
    assert served.engine.get(served.engine.list(limit=1)[0].id).signals == []


def asgi_post(app: Any, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """POST ``chunks`` (no Content-Length) to ``app`` in process: (status, chunks the server pulled)."""
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"transfer-encoding", b"chunked"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    asyncio.run(app(scope, receive, send))
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start")), pulled


def test_the_receiver_reads_at_most_its_own_limit_and_counts_its_413(served: Served) -> None:
    app = create_app(served.runtime)
    limit = served.runtime.settings.receiver.max_body_bytes
    assert served.runtime.settings.api.max_body_bytes >= 64 * limit
    chunk = b" " * 1024
    # Within the API's limit, above the receiver's: refused once the receiver's limit is crossed.
    status, pulled = asgi_post(app, "/notifications", [chunk] * (32 * limit // 1024), [(b"content-type", b"application/json")])
    assert (status, pulled) == (413, limit // 1024 + 1)
    # Above the API's limit too: the receiver's own refusal, counted.
    status, pulled = asgi_post(app, "/notifications", [chunk * 64] * 64, [(b"content-type", b"application/json")])
    assert (status, pulled) == (413, limit // (64 * 1024) + 1)
    assert served.counter("oversized") == 2


# -- the decoder itself ------------------------------------------------------------------------------------------


def test_the_depth_is_counted_on_the_decoded_text() -> None:
    assert too_deep("[" * MAX_DEPTH + "]" * MAX_DEPTH) is None
    assert too_deep('{"a": {"b": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}}") == "a.b"
    assert too_deep('{"a": "' + "[" * 500 + '"}') is None, "a bracket in a string is text"
    with pytest.raises(Refusal) as refused:
        decode_json(hidden_depth("x").encode("utf-8"))
    assert (refused.value.status, refused.value.field) == (422, "passThrough.deep")


def test_the_decoder_returns_the_value_it_checked() -> None:
    assert decode_json('{"a": [1, 2.5, "é", "😀", null, true]}'.encode()) == {"a": [1, 2.5, "é", "😀", None, True]}
    assert decode_json(b'{"pair": "\\ud83d\\ude00"}') == {"pair": "😀"}, "a surrogate pair is one character"
    with pytest.raises(Refusal) as refused:
        decode_json(b"{not json")
    assert (refused.value.status, refused.value.field) == (422, "(body)")
    assert refused.value.reason.startswith("body is not valid JSON")
