"""What both HTTP clients share below the routes: the error, the retry rule, and turning a Call into a
request and an answer into a model or an :class:`ApiError`.

Errors (one class, told apart by ``status`` and ``error``, as the API's own problem body does)::

    ApiError
      status 401, 403, 404, 405, 409, 413, 422, 500: the API's refusal (error, reason, field); not retryable
      status 429, 502, 503, 504:                     retryable (the server, or a proxy in front of it, is busy)
      status None, error "transport" or "timeout":   no answer came; retryable
      status None, error "bad_answer":               an answer whose body could not be decoded; retryable
      error "bad_answer" with a status:              a success whose body is not the route's model

``retryable`` says whether the failure may pass if the same call is made again; whether making it again
is *safe* depends on the call: the client itself retries only idempotent calls (GET, and a start or a
schedule created with an Idempotency-Key, which the server answers with the first call's result).
A start without a key that failed in transport may or may not have started a flow: give starts a key.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from durapay._calls import Call

T = TypeVar("T")

#: Statuses worth the same call again: rate limited, or a gateway/proxy/server briefly unable to answer.
RETRYABLE = frozenset({429, 502, 503, 504})


class ApiError(Exception):
    """The API refused a call, or no answer came. ``status`` (None: no answer), ``error`` (the API's
    code: ``not_found``, ``invalid_input``, ``conflict``...; ``transport`` or ``timeout`` when no answer
    came), ``reason`` (one line), ``field`` (the input it names, on 422: ``order.amount``,
    ``query.after``), ``retryable`` (a later try may succeed), ``retry_after`` (seconds, when the server
    said), and the call: ``method`` and ``path``."""

    def __init__(
        self,
        status: int | None,
        error: str,
        reason: str,
        *,
        field: str | None = None,
        retry_after: float | None = None,
        method: str = "",
        path: str = "",
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.field = field
        self.retryable = status is None or status in RETRYABLE
        self.retry_after = retry_after
        self.method = method
        self.path = path

    def __str__(self) -> str:
        where = f"{self.method} {self.path}: " if self.method else ""
        status = f"{self.status} " if self.status is not None else ""
        named = f" ({self.field})" if self.field else ""
        return f"{where}{status}{self.error}{named}: {self.reason}"


@dataclass(frozen=True)
class Retries:
    """How an idempotent call is tried again: at most ``attempts`` tries in all; before try n+1 a pause
    of up to ``base * 2**(n-1)`` seconds (at most ``cap``), half of it fixed and half drawn from ``rng``
    (so that many clients failing at once do not come back at once); a server's ``Retry-After`` is
    honoured up to ``cap``."""

    attempts: int = 4
    base: float = 0.25
    cap: float = 8.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base < 0 or self.cap < 0:
            raise ValueError("attempts is at least 1, base and cap at least 0")

    def pause(self, call: Call[Any], error: ApiError, attempt: int) -> float | None:
        """Seconds to wait before trying ``call`` again after ``attempt`` tries failed with ``error``;
        None: do not (not idempotent, not retryable, or the attempts are used up)."""
        if not call.idempotent or not error.retryable or attempt >= self.attempts:
            return None
        ceiling = min(self.cap, self.base * 2.0 ** (attempt - 1))
        pause = ceiling / 2 + self.rng.uniform(0, ceiling / 2)
        if error.retry_after is not None:
            pause = max(pause, min(error.retry_after, self.cap))
        return pause


def settings(
    api_key: str, timeout: float | httpx.Timeout, retries: int | Retries, rng: random.Random | None
) -> tuple[dict[str, str], httpx.Timeout, Retries]:
    """Headers, timeout and retry rule of either client (``retries``: tries after the first)."""
    if isinstance(retries, int):
        retries = Retries(attempts=retries + 1, rng=rng or random.Random())
    timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
    return {"X-Api-Key": api_key, "Accept": "application/json", "User-Agent": "durapay-client"}, timeout, retries


def request(http: httpx.Client | httpx.AsyncClient, call: Call[Any], timeout: httpx.Timeout) -> httpx.Request:
    """The request of ``call``; a long poll's read timeout is longer by what the server may hold it."""
    if call.hold and timeout.read is not None:
        timeout = httpx.Timeout(connect=timeout.connect, read=timeout.read + call.hold, write=timeout.write, pool=timeout.pool)
    return http.build_request(
        call.route.method,
        call.path,
        params=list(call.params),
        json=call.json,
        headers=dict(call.headers),
        timeout=timeout,
    )


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(model: type[T]) -> TypeAdapter[T]:
    """The model's validator, built once (building one costs far more than using it)."""
    adapter = _ADAPTERS.get(model)
    if adapter is None:
        adapter = _ADAPTERS[model] = TypeAdapter(model)
    return adapter


def answer(call: Call[T], response: httpx.Response) -> T:
    """The answer of ``call`` as its route's model, or the :class:`ApiError` of a refusal."""
    route = call.route
    if response.status_code not in route.answers:
        raise refusal(call, response)
    try:
        if route.answer is str:
            return _adapter(route.answer).validate_python(response.text)
        return _adapter(route.answer).validate_json(response.content)
    except ValidationError as exc:  # not the API's answer (a proxy's page with a 200): one error family still
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "(body)"
        reason = f"the answer is not a {route.answer.__name__}: {where}: {problem['msg']}"
        raise ApiError(response.status_code, "bad_answer", reason, method=route.method, path=call.path) from exc


def refusal(call: Call[Any], response: httpx.Response) -> ApiError:
    """The API's problem body (``{"error", "reason", "field"}``) as an ApiError; any other body (a
    proxy's page) as what it says: its status and a short excerpt of its text."""
    status = response.status_code
    try:
        problem = response.json()
    except ValueError:  # not JSON (json.JSONDecodeError is a ValueError)
        problem = None
    if not isinstance(problem, dict) or not isinstance(problem.get("error"), str):
        problem = {"error": "unavailable" if status in RETRYABLE else "http_error", "reason": not_a_problem(response)}
    return ApiError(
        status,
        problem["error"],
        str(problem.get("reason", "")),
        field=problem.get("field") if isinstance(problem.get("field"), str) else None,
        retry_after=_seconds(response.headers.get("Retry-After")),
        method=call.route.method,
        path=call.path,
    )


#: How much of a body that is not the API's problem a reason quotes.
EXCERPT = 160


def not_a_problem(response: httpx.Response) -> str:
    """The reason of an answer without the API's problem (a proxy's HTML page, an empty body): its
    status, that it holds no problem, and its text's first words, markup left out."""
    kind = response.headers.get("Content-Type", "no content type").split(";")[0]
    text = " ".join(re.sub(r"<[^>]*>", " ", response.text).split())
    excerpt = text[:EXCERPT] + ("..." if len(text) > EXCERPT else "")
    said = f": {excerpt}" if excerpt else " (empty)"
    return f"HTTP {response.status_code} {response.reason_phrase}, no JSON problem in the answer ({kind}){said}"


def no_answer(call: Call[Any], exc: httpx.RequestError) -> ApiError:
    """No usable answer, as a retryable ApiError with no status: a transport failure (refused, reset,
    timed out), or a body that could not be decoded (``bad_answer``: a ``Content-Encoding`` the body
    does not have, a proxy's garbling)."""
    error = "timeout" if isinstance(exc, httpx.TimeoutException) else "transport"
    if isinstance(exc, httpx.DecodingError):
        error = "bad_answer"
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ApiError(None, error, reason, method=call.route.method, path=call.path)


def _seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (an HTTP date is not worth parsing here: treated as absent)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
