"""Compact JSON with its encoder built once: the one form of what the engine and the schedules write.

``json.dumps(value, separators=..., sort_keys=...)`` builds a new ``JSONEncoder`` at every call with
any argument, which costs as much as encoding a small object: a start wrote its input, its log entry
and its input hash that way (three per flow), the scheduler several per occurrence. The encoders here
are made once per form, straight from the C accelerator where there is one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_encoder(*, sort_keys: bool = False, default: Callable[[Any], Any] = _not_json) -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), sort_keys=..., default=...)``, its encoder built once.
    No circular-reference check (what is written is a tree)."""
    if c_make_encoder is None:  # a Python without the json C accelerator
        return json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys, default=default).encode
    encode = c_make_encoder(None, default, encode_basestring_ascii, None, ":", ",", sort_keys, False, True)
    return lambda value: "".join(encode(value, 0))


#: Compact JSON, keys in their order / sorted and anything else as ``str`` (hashes, events, script arguments).
compact = json_encoder()
compact_sorted = json_encoder(sort_keys=True, default=str)
