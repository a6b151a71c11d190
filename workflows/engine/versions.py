"""A flow definition's version: a short hash of what a flow in flight depends on.

A flow records the version it started on (the record's ``definition`` field, ``kind@version``), and a
process runs its steps only with that version's definition (``workflows.engine.protocol``). So the version
must change exactly when a flow in flight could be run wrongly by the new code:

* the steps' names, kinds (call, wait, timer, the merchant's step) and order: a renamed step is a step
  the old record's ``step`` names no longer;
* the operations called: a different call at the same step is a different effect at the gateway;
* the input model's JSON schema (the stored input is read with it) and each step's output schema (a
  later step reads an earlier one's output as its model had it).

What does not change it: a step body's code (a bug fix in how a result is read), a description, the
label. docs/deploys.md says what that means for a deploy.

A record of an earlier release has no ``definition`` field: it was started before versions were
recorded, on the kind's first version as this code declares it, a migration's source included
(:func:`first_version`, :func:`recorded`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durapay.workflows.engine.steps import FlowDefinition, Step

#: Hex digits of the version: 12 (48 bits) makes two versions of one kind alike by chance unthinkable.
DIGITS = 12
#: The record field a flow's definition is kept in (``kind@version``).
FIELD = "definition"


def step_kind(step: Step) -> str:
    from durapay.workflows.engine.steps import CallStep, MerchantStep, SleepStep, WaitStep

    if isinstance(step, CallStep):
        return "call"
    if isinstance(step, WaitStep):
        return "wait"
    if isinstance(step, SleepStep):
        return "timer"
    if isinstance(step, MerchantStep):
        return "step"
    return type(step).__name__  # a step class of a test's own


def describe(definition: FlowDefinition) -> dict[str, Any]:
    """What the version hashes, and what a manifest shows of one version (``durapay flows manifest``)."""
    return {
        "kind": definition.kind,
        "input": definition.input_model.model_json_schema(mode="validation"),
        "steps": [describe_step(step) for step in definition.steps],
    }


def describe_step(step: Step) -> dict[str, Any]:
    from durapay.workflows.engine.steps import MerchantStep, WaitStep

    shown: dict[str, Any] = {"name": step.name, "kind": step_kind(step)}
    op = step.operation
    if op is not None:
        shown["operation"] = op.name
        shown["output"] = op.response.model_json_schema(mode="serialization")
    elif isinstance(step, WaitStep):
        shown["signals"] = list(step.signals)
    elif isinstance(step, MerchantStep) and step.output_model is not None:
        shown["output"] = step.output_model.model_json_schema(mode="serialization")
    return shown


def version_of(definition: FlowDefinition) -> str:
    text = json.dumps(describe(definition), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGITS]


def first_version(definition: FlowDefinition) -> FlowDefinition:
    """The version a record with no ``definition`` field started on: the earliest one the code knows of,
    held (the last of ``previous``, else the current one) or declared as a migration's source (the last
    of that version's ``migrates``). The one rule for such a record (:func:`recorded`, claim.lua's
    :func:`held_text`, ``workflows.deploys.in_flight``): a record of an earlier release is judged as a
    flow of that version, so a declared migration is asked (:func:`migration`) before it runs on the
    new steps, never put on them directly."""
    earliest = definition.previous[-1] if definition.previous else definition
    return earliest.migrates[-1] if earliest.migrates else earliest


def recorded(kind: str, fields: Mapping[str, str], registry: Mapping[str, FlowDefinition]) -> tuple[str, str]:
    """The (kind, version) a record names: its ``definition`` field, or for a record of an earlier
    release the kind's first version in ``registry`` ("" when the kind is not known here)."""
    value = fields.get(FIELD, "")
    if value:
        named, _, version = value.partition("@")
        return named or kind, version
    known = registry.get(kind)
    return kind, first_version(known).version if known is not None else ""


def label(definition: FlowDefinition) -> str:
    return f"{definition.kind}@{definition.version}"


def digest(schema: Any) -> str:
    """A JSON schema as a short hash: what a manifest carries of an input or output model."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGITS]


def shape(definition: FlowDefinition) -> dict[str, Any]:
    """What :func:`may_move` judges of one version: its ``version``, its ``input`` model's schema as a
    :func:`digest`, and its ``steps`` as :func:`describe_step` has them, each output schema as a digest.
    A manifest (``workflows.deploys.manifest``) carries exactly this per version and per migration, so
    that ``durapay deploy check`` judges a migration from a manifest by the rule the claim applies."""
    return {
        "version": definition.version,
        "input": digest(describe(definition)["input"]),
        "steps": [step_shape(step) for step in definition.steps],
    }


def step_shape(step: Step) -> dict[str, Any]:
    """:func:`describe_step`, its output schema as a :func:`digest` (a manifest stays small)."""
    shown = describe_step(step)
    if "output" in shown:
        shown["output"] = digest(shown["output"])
    return shown


def migration(old: FlowDefinition, new: FlowDefinition, step: str, unsettled: str | None = None) -> str | None:
    """Whether a flow of ``old`` at ``step`` may go on on ``new`` (None) or why not: :func:`may_move` on
    the two versions' :func:`shape` (the claim's question; deploy check asks it of a manifest's)."""
    return may_move(shape(old), shape(new), step, unsettled)


def may_move(old: Mapping[str, Any], new: Mapping[str, Any], step: str, unsettled: str | None = None) -> str | None:
    """The one home of "may this flow migrate": whether a flow of version ``old`` at ``step`` may go on on
    version ``new`` (None) or why not, both given as :func:`shape` has them (from the code, or from a
    manifest). The input's schema is the same, and every step up to ``step`` (the steps it did, and the
    one it is at) is the same in both (name, kind, operation, output schema), so that what it recorded is
    what ``new`` expects; and no money is unsettled at a step that changed (``unsettled``: the step of the
    flow's money in flight, if any). A shape that does not say its input schema (a manifest an earlier
    release printed) is never judged the same: the rule cannot be applied to it."""
    old_version, new_version = old.get("version"), new.get("version")
    if old.get("input") is None or new.get("input") is None:
        return f"the manifest does not give the input model of version {old_version} or {new_version} (print it again)"
    if old["input"] != new["input"]:
        return f"the input model changed between versions {old_version} and {new_version}"
    old_names = [each.get("name") for each in old.get("steps") or ()]
    new_names = [each.get("name") for each in new.get("steps") or ()]
    if step not in old_names or step not in new_names:
        return f"step {step!r} is not in version {new_version}"
    done = list(old["steps"][: old_names.index(step) + 1])
    if done != list(new["steps"][: new_names.index(step) + 1]):
        return f"it has reached steps that changed in version {new_version}"
    if unsettled and unsettled not in {each.get("name") for each in done}:
        return f"money is unsettled at step {unsettled!r}, which changed in version {new_version}"
    return None


def migrations(registry: Mapping[str, FlowDefinition]) -> dict[tuple[str, str], tuple[FlowDefinition, FlowDefinition]]:
    """Per (kind, old version) a definition of ``registry`` declares a migration from: (old, new)."""
    found: dict[tuple[str, str], tuple[FlowDefinition, FlowDefinition]] = {}
    for kind, definition in registry.items():
        for current in definition.versions().values():
            for old in current.migrates:
                if (kind, old.version) not in found and old.version not in definition.versions():
                    found[(kind, old.version)] = (old, current)
    return found


def held(registry: Mapping[str, FlowDefinition]) -> dict[tuple[str, str], FlowDefinition]:
    """Every (kind, version) the code of ``registry`` runs: each kind's current and previous versions."""
    return {(kind, version): found for kind, definition in registry.items() for version, found in definition.versions().items()}


def held_text(registry: Mapping[str, FlowDefinition]) -> str:
    """claim.lua's ARGV 10: the definitions held (`` kind@version ``), and per kind the one a record with
    no definition field started on (`` kind=kind@version ``), each between spaces."""
    names = [f"{kind}@{version}" for kind, version in (*held(registry), *migrations(registry))]  # a migration decides in Python
    names += [f"{kind}={label(first_version(definition))}" for kind, definition in registry.items()]
    return " " + " ".join(names) + " "
