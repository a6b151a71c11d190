"""A fuzz pass with the hostile encodings, on every route of the OpenAPI document and the open receiver:
UTF-16 and UTF-32 (with and without a byte order mark), UTF-8 with one, bytes that are not UTF-8, lone
surrogates, NUL and control characters, deep nesting, huge numbers, NaN and Infinity, and the same in
paths, queries and the headers the application reads. The acceptance (issue 37): no answer of 500 or
more, and nothing written to the store (its keys and values under the test's prefix are the same after
each request; the counters that say what was refused aside).

Cheap by design: a fixed corpus (no random run), each item sent once to each route that takes it; a
few seconds for the whole pass. The OpenAPI fuzz (tests/service/test_openapi_fuzz.py) explores the
schema; this pass is about what the boundary (``service.inbound``) refuses before any schema is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from durapay.service.runtime import Runtime
from tests.service.conftest import API_KEY, Served, notification, service_runtime, waiting_flow

KEY = {"X-Api-Key": API_KEY}
TOKEN = "2f0ea5059b41414ca3744fe672327d85"


@pytest.fixture
def runtime(own_redis_url: str, key_prefix: str) -> Iterator[Runtime]:
    """On a Valkey of this file's own: the test reads the whole store after each request."""
    yield from service_runtime(own_redis_url, key_prefix)


def plausible(hole: str) -> str:
    """A body that names the fields most routes read, ``hole`` (JSON text) where a value goes."""
    return (
        (
            '{"order": {"orderId": "ord-hostile", "amount": "1500", "currency": "EUR", "description": HOLE},'
            ' "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},'
            ' "reason": HOLE, "by": HOLE, "description": HOLE, "url": "https://hooks.example.com/h",'
            ' "action": "retry", "error": HOLE, "passThrough": {"note": HOLE, HOLEKEY: 1}}'
        )
        .replace("HOLEKEY", '"k' + hole.strip('"') + '"' if hole.startswith('"') else '"k"')
        .replace("HOLE", hole)
    )


VALUES = {
    "lone high surrogate": '"a\\ud800b"',
    "lone low surrogate": '"\\udfff"',
    "reversed pair": '"\\ude00\\ud83d"',
    "NUL": '"a\\u0000b"',
    "control characters": '"\\u0001\\u001b[31m\\u007f\\u0085"',
    "NaN": "NaN",
    "Infinity": "-Infinity",
    "a float beyond a double": "1e999",
    "an integer beyond 64 bits": "9223372036854775808",
    "5000 digits": "1" * 5000,
    "deep lists": "[" * 5000 + "]" * 5000,
    "deep objects": '{"a":' * 300 + "1" + "}" * 300,
}
#: Whole bodies, as bytes, with the content type they are sent under.
BODIES: dict[str, tuple[bytes, str]] = {
    **{f"{name}": (plausible(value).encode(), "application/json") for name, value in VALUES.items()},
    "UTF-16 LE": (plausible('"x"').encode("utf-16-le"), "application/json"),
    "UTF-16 BE with a mark": (b"\xfe\xff" + plausible('"x"').encode("utf-16-be"), "application/json"),
    "UTF-32": (plausible('"x"').encode("utf-32"), "application/json"),
    "UTF-8 with a mark": (b"\xef\xbb\xbf" + plausible('"x"').encode(), "application/json"),
    "latin-1 bytes": (plausible('"caf\xe9"').encode("latin-1"), "application/json"),
    "an overlong NUL": (plausible('"a\xc0\x80"'.encode("latin-1").decode("latin-1")).encode("latin-1"), "application/json"),
    "a surrogate encoded in UTF-8": (plausible('"x"').replace('"x"', '"\xed\xa0\x80"', 1).encode("latin-1"), "application/json"),
    "a raw NUL": (plausible('"a\x00b"').encode(), "application/json"),
    "a charset not UTF-8": (plausible('"x"').encode(), "application/json; charset=utf-16"),
    "a media type not JSON": (plausible('"x"').encode(), "text/plain"),
    "a form with NUL": (b"reason=a%00b&by=%ff", "application/x-www-form-urlencoded"),
    "multipart": (b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n\x00\r\n--b--\r\n", "multipart/form-data; boundary=b"),
    "nothing but brackets": (b"[" * 100_000, "application/json"),
}
#: Percent-encoded path segments and query values.
SEGMENTS = ["%00", "a%01b", "%ff%fe", "%ed%a0%80", "%c0%80", "%e2%80%ae", "%7f"]
HEADER_VALUES = [b"caf\xe9", b"\x80\xff", b"a\x7fb"]


def snapshot(served: Served) -> dict[bytes, Any]:
    """What the store holds under the test's prefix, the counters and metrics of what happened aside
    (a refusal is counted; a step's metrics are flushed when they are)."""
    redis = served.engine.redis
    counters = served.engine.keys.counter("")
    return {
        key: redis.dump(key)
        for key in redis.scan_iter(match=served.engine.keys.prefix + "*")
        if not key.decode().startswith(counters) and ":metrics:" not in key.decode()
    }


def filled(path: str, ids: dict[str, str], name: str = "", segment: str = "") -> str:
    """``path`` with its parameters filled from ``ids``, ``name``'s with ``segment``."""
    return re.sub(r"{(\w+)}", lambda match: segment if match.group(1) == name else ids[match.group(1)], path)


def routes(doc: dict[str, Any]) -> list[tuple[str, str, bool, list[dict[str, Any]]]]:
    found = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            found.append((method.upper(), path, "requestBody" in operation, operation.get("parameters", [])))
    return found


@pytest.fixture
def flow_id(served: Served) -> str:
    return waiting_flow(served.engine, "ord-hostile-known", TOKEN)


def test_no_hostile_input_is_a_5xx_or_writes_anything(served: Served, flow_id: str, api_document: dict[str, Any]) -> None:
    found = routes(api_document)
    assert len(found) > 60
    before = snapshot(served)
    server_errors: list[str] = []
    written: list[str] = []
    sent = 0

    def send(label: str, method: str, url: str, **kwargs: Any) -> None:
        nonlocal sent
        answer = served.http.request(method, url, **kwargs)
        sent += 1
        if answer.status_code >= 500:
            server_errors.append(f"{label}: {method} {url} -> {answer.status_code} {answer.text[:200]}")
        after = snapshot(served)
        if after != before:
            changed = sorted(
                key.decode() for key in set(after) ^ set(before) | {k for k in after if after.get(k) != before.get(k)}
            )
            written.append(f"{label}: {method} {url} -> {answer.status_code} {answer.text[:200]}: {changed}")
            before.clear()
            before.update(snapshot(served))

    for method, path, has_body, parameters in found:
        ids = {
            p["name"]: flow_id if p["name"] == "flow_id" else "moto" if p["name"] == "kind" else "x1"
            for p in parameters
            if p["in"] == "path"
        }
        url = filled(path, ids)
        if has_body:
            for name, (raw, media) in BODIES.items():
                send(name, method, url, content=raw, headers={**KEY, "Content-Type": media})
        for segment in SEGMENTS:
            for name in ids:
                send(f"path {name}={segment}", method, filled(path, ids, name, segment), headers=KEY)
            for parameter in parameters:
                if parameter["in"] == "query":
                    send(f"query {parameter['name']}={segment}", method, f"{url}?{parameter['name']}={segment}", headers=KEY)
        for parameter in parameters:
            if parameter["in"] == "header":
                for value in HEADER_VALUES:
                    send(
                        f"header {parameter['name']}",
                        method,
                        url,
                        content=b"{}",
                        headers=[*KEY.items(), ("Content-Type", "application/json"), (parameter["name"], value)],
                    )
    # The console's forms (an open path: the boundary reads them before any session is asked for).
    for path in (
        "/console/login",
        "/console/logout",
        "/console/bulk",
        f"/console/flows/{flow_id}/cancel",
        "/console/kinds/moto/pause",
    ):
        for name, (raw, media) in BODIES.items():
            send(f"console {name}", "POST", path, content=raw, headers={"Content-Type": media})
        for segment in SEGMENTS:
            send(f"console query {segment}", "GET", f"/console/flows?state={segment}")
    # The open receiver, with its own corpus: notifications for a known order, hostile where it reads.
    known = notification("ord-hostile-known", TOKEN)
    for field in ("eventId", "securityToken"):
        for name, value in VALUES.items():
            send(
                f"notification {field} {name}",
                "POST",
                "/notifications",
                content=json.dumps(known).replace(f'"{field}": "{known[field]}"', f'"{field}": {value}').encode(),
                headers={"Content-Type": "application/json"},
            )
    for field in ("orderId", "operationId"):
        for name, value in VALUES.items():
            body = json.dumps(known).replace(f'"{field}": "{known["operation"][field]}"', f'"{field}": {value}')
            send(
                f"notification operation.{field} {name}",
                "POST",
                "/notifications",
                content=body.encode(),
                headers={"Content-Type": "application/json"},
            )
    for name, (raw, media) in BODIES.items():
        send(f"notification {name}", "POST", "/notifications", content=raw, headers={"Content-Type": media})
    assert sent > 1500
    assert server_errors == []
    assert written == []
