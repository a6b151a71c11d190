"""The one way tests wait: poll a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Return ``probe()``'s first truthy value; fail naming ``what`` after ``timeout`` seconds.

    The pause grows from 5 ms to 100 ms, so quick conditions are seen at once and slow ones do not
    spin. The timeout is generous on purpose: it bounds a hang, it does not measure speed.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
