"""The demo's merchant backend: it drives durapay only through the control API, as a real one would.

Thin on purpose: start a flow, read it, wait for it, signal it, cancel it, and the schedule calls. An
answer that is not the expected status raises :class:`DemoError` carrying the API's one-line reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

FINISHED = frozenset({"succeeded", "failed", "cancelled", "needs_attention"})


class DemoError(Exception):
    """A step of the demo did not go as planned (the message says which and why)."""


class Merchant:
    def __init__(self, api_url: str, api_key: str) -> None:
        self.http = httpx.Client(base_url=api_url, headers={"X-Api-Key": api_key}, timeout=30.0)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, expect: int | tuple[int, ...] = 200, **kwargs: Any) -> Any:
        answer = self.http.request(method, path, **kwargs)
        if answer.status_code not in (expect if isinstance(expect, tuple) else (expect,)):
            raise DemoError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
        return answer.json()

    def start(self, kind: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        result: dict[str, Any] = self._call("POST", f"/flows/{kind}", 201, json=body, headers=headers)
        return result

    def flow(self, flow_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/flows/{flow_id}")
        return result

    def history(self, flow_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/flows/{flow_id}/history")["history"]
        return result

    def wait(
        self,
        flow_id: str,
        until: Callable[[dict[str, Any]], bool] = lambda view: view["state"] in FINISHED,
        *,
        timeout: float = 30.0,
        what: str = "to finish",
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.flow(flow_id)
            if until(view):
                return view
            if time.monotonic() > deadline:
                raise DemoError(
                    f"flow {flow_id} ({view['kind']}) did not {what} within {timeout:g}s: {view['state']} at {view['step']}"
                )
            time.sleep(0.1)

    def signal(self, flow_id: str, name: str, payload: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/flows/{flow_id}/signals/{name}", json=payload)
        return result

    def cancel(self, flow_id: str, reason: str) -> dict[str, Any]:
        # 202: a request (the flow first closes what its customer could pay on, or reads money in flight)
        result: dict[str, Any] = self._call("POST", f"/flows/{flow_id}/cancel", (200, 202), json={"reason": reason})
        return result

    def create_schedule(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/schedules", 201, json=body, headers={"Idempotency-Key": key})
        return result

    def schedule(self, schedule_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/schedules/{schedule_id}")
        return result

    def wait_schedule(
        self, schedule_id: str, until: Callable[[dict[str, Any]], bool], *, timeout: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.schedule(schedule_id)
            if until(view):
                return view
            if time.monotonic() > deadline:
                raise DemoError(f"schedule {schedule_id} did not {what} within {timeout:g}s (state {view['state']})")
            time.sleep(0.1)
