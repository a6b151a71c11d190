"""The receiver's HTTP route: read a bounded body, hand it to :class:`NotificationReceiver`.

The body is read here, chunk by chunk, so that an oversized request is refused without ever holding
more than the limit in memory; the checks, the durable record and the signal are in ``receiver``.
Work the receiver leaves for after the answer (:attr:`Receipt.after`: an unknown order's count and
merchant event) runs as the response's background task, once the answer is sent: its time never shows
in the answer's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from durapay.service.receiver import AN_OPERATION_ID, NotificationReceiver

#: For OpenAPI only: the gateway's notification body (docs/gateway.md); every field is optional.
NOTIFICATION_SCHEMA: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["operation"],
                "properties": {
                    "eventId": {"type": "string"},
                    "eventTime": {"type": "string"},
                    "securityToken": {"type": "string"},
                    "operation": {
                        "type": "object",
                        "required": ["orderId", "operationId"],
                        "properties": {
                            "orderId": {"type": "string", "minLength": 1},
                            "operationId": {"type": "string", "minLength": 1, "pattern": AN_OPERATION_ID.pattern},
                        },
                        "description": "the gateway's Operation; orderId and operationId are required",
                    },
                },
            }
        }
    },
}

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": 'recorded (or a repeat of a recorded event): `{"outcome": "OK"}`'},
    400: {"description": 'malformed body: `{"outcome": "KO", "error": "<the problem>"}`'},
    401: {
        "description": "refused: wrong, missing or foreign security token, unknown order, or an operation the "
        "gateway shows on another order (not said which; an unknown order is counted and told to the merchant "
        "as notification.unknown_order after the answer)"
    },
    413: {"description": "body above DURAPAY_RECEIVER__MAX_BODY_BYTES"},
    503: {
        "description": "not recorded, retry: the gateway has no such operation (yet), the operation could not be "
        "read back from the gateway, Redis is unavailable, or the same event is still being recorded"
    },
}


class _TooLarge(Exception):
    pass


async def read_bounded(request: Request, limit: int) -> bytes:
    """The body, or _TooLarge as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (declared.isascii() and declared.isdigit()) and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def receiver_router(receiver: NotificationReceiver) -> APIRouter:
    router = APIRouter(tags=["notifications"])
    limit = receiver.settings.max_body_bytes

    @router.post(
        receiver.settings.path,
        summary="Receive a gateway notification (open: no API key; the security token is checked)",
        openapi_extra={"requestBody": NOTIFICATION_SCHEMA},
        responses=RESPONSES,
    )
    async def receive_notification(request: Request) -> JSONResponse:
        try:
            body = await read_bounded(request, limit)
        except _TooLarge:
            refused = receiver.oversized()
            return JSONResponse(refused.body, status_code=refused.status, headers={"Connection": "close"})
        receipt = await run_in_threadpool(receiver.receive, body, defer=True)
        later = BackgroundTask(receipt.after) if receipt.after is not None else None
        return JSONResponse(receipt.body, status_code=receipt.status, background=later)

    return router
