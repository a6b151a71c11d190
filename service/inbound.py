"""The one input boundary: every body, path, query and header value the HTTP surface takes is decoded here.

Why one: each reader behind the door had its own idea of text. FastAPI's JSON parser read UTF-16 and
UTF-32 as well as UTF-8 (``json.loads`` on bytes guesses), while the gate counted nesting on the bytes
as if they were ASCII: a UTF-16 body whose strings held a character with a ``"`` byte hid its brackets,
and a ``passThrough`` 300 levels deep reached pydantic's serializer (500). A ``"\\ud800"`` escape is
valid JSON syntax but no text: it passed the notification receiver's parser and raised
``UnicodeEncodeError`` where an order id was hashed (500 on the open path). ``NaN``, ``Infinity`` and
``1e999`` (not JSON numbers) were stored and shown. Now every door asks this module, once, before
anything reads the input:

* **Bodies are UTF-8 JSON** (RFC 8259 §8.1): a byte order mark, UTF-16 or UTF-32 (told by the mark or
  by the zero bytes of its first characters), a ``charset`` other than UTF-8, or bytes that are not
  UTF-8 are refused with 415 ``unsupported_encoding`` naming what was sent; a body of another media type
  with 415 ``unsupported_media_type`` (the console's forms are ``application/x-www-form-urlencoded``,
  their values UTF-8 after percent-decoding).
* **Depth and size on the decoded text**: at most :data:`MAX_DEPTH` levels of arrays and objects,
  counted by a scan of the decoded text that does not recurse (``field`` names where); the gate reads
  at most its route's limit before this runs.
* **Text is text**: no string (a key or a value) may hold a lone UTF-16 surrogate; none may hold a
  control character (C0, DEL, C1) except tab, line feed and carriage return in a value that is free
  text (never in a key, an identifier, a path, a query or a header). 422 naming the field.
* **Numbers are numbers**: ``NaN`` and ``Infinity`` are refused (not JSON), and so are a float that
  does not fit a double (``1e999``) and an integer beyond 64 bits. 422 naming the field.
* **Path, query and the headers the application reads** (:data:`HEADERS`): UTF-8 after
  percent-decoding, no control character; a header value is printable ASCII (RFC 9110 §5.5).

Who asks: ``service.guard.ControlGate`` for every route but the receiver (which reads its own body
within its own, smaller limit and asks :func:`decode_json` in ``NotificationReceiver.receive``), the
console's form reader (``service.console.web.read_form``) and the CLI's JSON input
(``service.cli._common.read_json_input``). A refusal is a :class:`Refusal`: status, code, reason and
field, never an exception of the parser's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from durapay.workflows.engine import identifier

#: The deepest nesting of arrays and objects a body may have (the body itself is level 1). Merchant
#: input nests a few levels; 32 leaves room for any ``passThrough`` or ``customField`` while staying far
#: below the shallowest reader behind the gate (pydantic's serializer, near 255).
MAX_DEPTH = 32
#: The largest integer a body may hold (64 bits, signed): what Redis and every JSON reader downstream keep.
MAX_INTEGER = 2**63 - 1
#: Headers whose values the application reads (``Idempotency-Key`` is a start key; the others are
#: compared or parsed): each must be printable ASCII. A test checks that every header the OpenAPI
#: document declares is here.
HEADERS = ("idempotency-key", "x-api-key", "authorization", "content-type", "origin")
#: The media types read as JSON (FastAPI's rule: ``application/json``, any ``+json``, or none given).
FORM = "application/x-www-form-urlencoded"
RFC = "RFC 8259 §8.1"


class Refusal(ValueError):
    """Input refused at the boundary: the HTTP ``status`` (415 or 422), the ``error`` code of the API's
    error shape, a one-line ``reason`` and the ``field`` it names (``None`` for the body's encoding)."""

    def __init__(self, status: int, error: str, reason: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.field = field


def _encoding_refused(reason: str) -> Refusal:
    return Refusal(415, "unsupported_encoding", f"{reason}; JSON between systems is UTF-8 ({RFC})")


def invalid(field: str, reason: str) -> Refusal:
    return Refusal(422, "invalid_input", reason, field)


# -- the encoding ------------------------------------------------------------------------------------

_MARKS = (
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with a byte order mark)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with a byte order mark)"),
    (b"\xef\xbb\xbf", "UTF-8 with a byte order mark (U+FEFF)"),
    (b"\xfe\xff", "UTF-16 (big-endian, with a byte order mark)"),
    (b"\xff\xfe", "UTF-16 (little-endian, with a byte order mark)"),
)


def _wide(raw: bytes) -> str | None:
    """UTF-16 or UTF-32 without a mark, told as RFC 4627 §3 does: a JSON text begins with two ASCII
    characters, so the zero bytes among its first four say which."""
    head = raw[:4]
    if len(head) >= 4 and head[:3] == b"\x00\x00\x00":
        return "UTF-32 (big-endian)"
    if len(head) >= 4 and head[1:4] == b"\x00\x00\x00":
        return "UTF-32 (little-endian)"
    if len(head) >= 2 and head[0] == 0:
        return "UTF-16 (big-endian)"
    if len(head) >= 2 and head[1] == 0:
        return "UTF-16 (little-endian)"
    return None


def media_type(content_type: str | None) -> tuple[str, str | None]:
    """``("application/json", "utf-8")`` from a Content-Type value: the type (lower case) and its charset."""
    if not content_type:
        return "", None
    kind, *params = content_type.split(";")
    charset = None
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    return kind.strip().lower(), charset


def is_json(kind: str) -> bool:
    return kind in ("", "application/json") or kind.endswith("+json")


def text_of(raw: bytes, charset: str | None = None) -> str:
    """The body as text: UTF-8, or :class:`Refusal` (415) naming what it is instead."""
    if charset is not None and charset not in ("utf-8", "utf8"):
        raise _encoding_refused(f"the body is declared charset={charset[:40]}")
    for mark, name in _MARKS:
        if raw.startswith(mark):
            raise _encoding_refused(f"the body is {name}")
    wide = _wide(raw)
    if wide is not None:
        raise _encoding_refused(f"the body is {wide}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _encoding_refused(f"the body is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


# -- depth ---------------------------------------------------------------------------------------------

# A string (skipped whole, a key when a colon follows), a bracket or a comma; nothing else matters to depth.
_TOKENS = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:)?|[\[\]{},]', re.DOTALL)


def too_deep(text: str, limit: int = MAX_DEPTH) -> str | None:
    """The field where the JSON ``text`` nests deeper than ``limit`` (``(body)`` for the body itself), or None.

    A scan over the decoded text, not a parse: it never recurses, and a malformed body is left to the
    parser (whatever this says of it, the body is refused either way). The field is named by its keys,
    down to the first list in its path: ``passThrough.deep`` for ``{"passThrough": {"deep": [[[...]]]}}``."""
    path: list[str | int | None] = []  # per open level: its current key (object) or index (array)
    for token in _TOKENS.finditer(text):
        found = token.group(0)
        if found in ("{", "["):
            if len(path) >= limit:
                return _field(path)
            path.append(None if found == "{" else 0)
        elif found in ("}", "]"):
            if path:
                path.pop()
        elif found == ",":
            if path and isinstance(path[-1], int):
                path[-1] += 1
        elif token.group(2) is not None and path and not isinstance(path[-1], int):
            path[-1] = token.group(1)
    return None


def _field(path: list[str | int | None]) -> str:
    named: list[str] = []
    for part in path:
        if not isinstance(part, str):
            break
        named.append(part)
    return ".".join(named[:3]) or "(body)"


# -- text and numbers ------------------------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")
#: Control characters (C0, DEL, C1): none in a key, an identifier, a path, a query or a header ...
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: ... and none but tab, line feed and carriage return in free text.
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def text_problem(text: str, *, free: bool) -> str | None:
    """Why ``text`` cannot be a field's value (``free``: free text, which may hold tab, LF and CR), or None."""
    if _SURROGATE.search(text):
        return "holds a lone UTF-16 surrogate (an escape such as \\ud800 with no pair): not Unicode text"
    control = (_CONTROL_IN_TEXT if free else _CONTROL).search(text)
    if control:
        where = "" if free else " (tab and line breaks only in free text)"
        return f"holds the control character U+{ord(control.group(0)):04X}, which this field cannot hold{where}"
    return None


class _Number:
    """A number the body holds that no reader downstream can keep; the walk names its field."""

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_int(text: str) -> int | _Number:
    if len(text.lstrip("-")) > 19:  # more digits than 64 bits hold (and than int() reads quickly)
        return _Number(text)
    value = int(text)
    return value if -MAX_INTEGER - 1 <= value <= MAX_INTEGER else _Number(text)


def _parse_float(text: str) -> float | _Number:
    value = float(text)
    return value if math.isfinite(value) else _Number(text)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def shown(text: str) -> str:
    """``text`` fit to quote in an answer: each control character and lone surrogate as its escape
    (``\\u0000``, ``\\ud800``), so that the answer naming a field is itself text."""
    return _UNSHOWABLE.sub(lambda match: f"\\u{ord(match.group(0)):04x}", text)


def _where(path: str, key: str | int) -> str:
    name = shown(key) if isinstance(key, str) else str(key)
    return f"{path}.{name}" if path else name


def check_value(value: Any, path: str = "") -> None:
    """Raise :class:`Refusal` (422 naming the field) for the first string or number of a parsed JSON
    ``value`` that is no text or no number (see the module's docstring). Iterative; the depth is bounded
    before this runs."""
    pending: list[tuple[Any, str, bool]] = [(value, path, True)]
    while pending:
        item, where, free = pending.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                named = _where(where, key)
                problem = text_problem(key, free=False)
                if problem is not None:
                    raise invalid(named, f"the key {problem}")
                pending.append((inner, named, not identifier(key)))
        elif isinstance(item, list):
            pending.extend((inner, _where(where, index), free) for index, inner in enumerate(item))
        elif isinstance(item, str):
            problem = text_problem(item, free=free)
            if problem is not None:
                raise invalid(where or "(body)", problem)
        elif isinstance(item, _Number):
            shown = item.text if len(item.text) <= 30 else item.text[:30] + "..."
            raise invalid(where or "(body)", f"{shown} is out of range (integers within 64 bits, finite numbers only)")


def parse_json(text: str) -> Any:
    """``text`` parsed as JSON, depth first, then every string and number checked (:class:`Refusal`)."""
    field = too_deep(text)
    if field is not None:
        raise invalid(field, f"nested deeper than {MAX_DEPTH} levels of arrays and objects")
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_not_json)
    except RecursionError:  # not reached under MAX_DEPTH; kept so that no parser error escapes
        raise invalid("(body)", f"nested deeper than {MAX_DEPTH} levels of arrays and objects") from None
    except ValueError as exc:
        raise invalid("(body)", f"body is not valid JSON: {exc}") from None
    check_value(value)
    return value


def decode_json(raw: bytes, content_type: str | None = None) -> Any:
    """A JSON body (bytes) decoded at the boundary: UTF-8, bounded in depth, its text and numbers checked.
    ``content_type``: the request's, whose charset (if any) must be UTF-8."""
    return parse_json(text_of(raw, media_type(content_type)[1]))


# -- forms, paths, queries, headers -------------------------------------------------------------------------


def _percent_decoded(part: bytes, field: str, *, plus: bool) -> str:
    raw = unquote_to_bytes(part.replace(b"+", b" ") if plus else part)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(field, "is not UTF-8 text after percent-decoding") from None


def pairs(encoded: bytes, where: str) -> list[tuple[str, str]]:
    """The name/value pairs of a query string or a form body (``where``: ``query`` or ``form``), each
    UTF-8 after percent-decoding and holding no control character but, in a form's values, tab and
    line breaks (a text area's)."""
    found: list[tuple[str, str]] = []
    for part in encoded.split(b"&"):
        if not part:
            continue
        raw_name, _, raw_value = part.partition(b"=")
        name = _percent_decoded(raw_name, f"{where}.(name)", plus=True)
        field = f"{where}.{name}" if where == "query" else name
        problem = text_problem(name, free=False)
        if problem is not None:
            raise invalid(f"{where}.(name)", f"a name {problem}")
        value = _percent_decoded(raw_value, field, plus=True)
        problem = text_problem(value, free=where == "form")
        if problem is not None:
            raise invalid(field, problem)
        found.append((name, value))
    return found


def decode_form(raw: bytes, content_type: str | None = None) -> dict[str, str]:
    """A form body (``application/x-www-form-urlencoded``): the first value of each field."""
    charset = media_type(content_type)[1]
    if charset is not None and charset not in ("utf-8", "utf8"):
        raise _encoding_refused(f"the form is declared charset={charset[:40]}")
    fields: dict[str, str] = {}
    for name, value in pairs(raw, "form"):
        fields.setdefault(name, value)
    return fields


def check_path(raw_path: bytes) -> None:
    """The request's path (as sent, percent-encoded): UTF-8 once decoded, no control character."""
    path = _percent_decoded(raw_path, "(path)", plus=False)
    problem = text_problem(path, free=False)
    if problem is not None:
        raise invalid("(path)", problem)


def check_headers(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Each header of :data:`HEADERS` is printable ASCII (space and tab allowed inside)."""
    for name, value in headers:
        lowered = name.decode("latin-1").lower()
        if lowered in HEADERS and any(byte > 0x7E or (byte < 0x20 and byte != 0x09) for byte in value):
            title = "-".join(word.capitalize() for word in lowered.split("-"))
            raise invalid(f"header.{title}", "must be printable ASCII text (RFC 9110 §5.5)")


def check_request(scope: dict[str, Any] | Any) -> None:
    """The path, the query and the headers the application reads of an ASGI request (:class:`Refusal`)."""
    raw_path = scope.get("raw_path") or str(scope.get("path", "")).encode("utf-8", "surrogatepass")
    check_path(raw_path)
    pairs(scope.get("query_string") or b"", "query")
    check_headers(scope.get("headers") or [])


def check_body(raw: bytes, content_type: str | None) -> None:
    """A request body, by its media type: JSON (:func:`decode_json`), a form (:func:`decode_form`), or
    :class:`Refusal` (415) for any other type. An empty body is the route's to judge."""
    if not raw:
        return
    kind, _ = media_type(content_type)
    if is_json(kind):
        decode_json(raw, content_type)
    elif kind == FORM:
        decode_form(raw, content_type)
    else:
        raise Refusal(
            415, "unsupported_media_type", f"a body of type {kind[:60]} is not read here: send application/json (UTF-8)"
        )
