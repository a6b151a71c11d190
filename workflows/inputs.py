"""A flow's input as a merchant sends it: read strictly, before anything is written.

The engine's own reading (``Engine.validate``, and the stored input read again at each step) is the
lenient one: a record written by an earlier release must still run. What a merchant sends through the
API or the CLI is read here first, with the same model in its strict mode (``gateway._strict``): an
unknown field, an unknown value of a closed set or an amount out of bounds is an ``InputError`` naming
the field, the reason and, for a typo, the closest known name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway import describe_validation_error, validate_strict
from workflows.engine import InputError
from workflows.steps import FlowDefinition


def read_input(registry: Mapping[str, FlowDefinition], kind: str, data: Mapping[str, Any] | BaseModel) -> BaseModel:
    """``data`` as the input model of ``kind``, read strictly; InputError(kind, field, reason) otherwise."""
    definition = registry.get(kind)
    if definition is None:
        raise InputError(kind, "kind", f"unknown flow kind; known kinds: {', '.join(sorted(registry))}")
    try:
        return validate_strict(definition.input_model, data)
    except ValidationError as exc:
        field, reason = describe_validation_error(exc)
        raise InputError(kind, field, reason) from None
