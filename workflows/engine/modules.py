"""The merchant's own flow kinds: the modules ``DURAPAY_FLOWS__MODULES`` names, loaded by every process.

Every process (worker, scheduler, API, CLI) builds its registry here (:func:`registry`): durapay's kinds
and those of each module named, so that a kind of the merchant's own gets the API route, the CLI, the
console, events, bulk actions and schedules as a built-in one does. A module declares its flows with
``durapay.flows`` and lists them in ``FLOWS`` (else every ``Flow`` it defines at module level is taken).

A module that cannot be imported, a kind that is durapay's own, or one declared by two modules is
refused at start with the module and the reason: a process must not run with part of the code the
others have (its flows would park: workflows.engine.versions).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from durapay.config.settings import SettingsError
from durapay.workflows.engine.steps import DefinitionError, FlowDefinition

SETTING = "DURAPAY_FLOWS__MODULES"


def load(names: Iterable[str], builtin: Mapping[str, FlowDefinition]) -> dict[str, FlowDefinition]:
    """The kinds the modules ``names`` declare, by kind. SettingsError names the module and why."""
    found: dict[str, FlowDefinition] = {}
    where: dict[str, str] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except DefinitionError as exc:
            raise SettingsError(f"{SETTING}: module {name}: {exc}") from None
        except ImportError as exc:
            raise SettingsError(f"{SETTING}: module {name} does not import: {exc}") from None
        declared = getattr(module, "FLOWS", None)
        if declared is None:
            declared = [value for value in vars(module).values() if isinstance(value, FlowDefinition)]
        for definition in declared:
            if not isinstance(definition, FlowDefinition):
                raise SettingsError(f"{SETTING}: module {name}: FLOWS holds {definition!r}, not a durapay.flows.Flow")
            kind = definition.kind
            if kind in builtin:
                raise SettingsError(f"{SETTING}: module {name}: kind {kind!r} is one of durapay's own; name yours otherwise")
            if kind in found:
                raise SettingsError(f"{SETTING}: kind {kind!r} is declared by {where[kind]} and by {name}")
            found[kind], where[kind] = definition, name
    if not found and names:
        raise SettingsError(f"{SETTING}: the modules {', '.join(names)} declare no flow")
    return found


def registry(names: Iterable[str]) -> dict[str, FlowDefinition]:
    """durapay's kinds and those of the modules ``names``: what a process's engine is built with."""
    from durapay.workflows.flows import REGISTRY

    kinds = dict(REGISTRY)
    kinds.update(load(list(names), REGISTRY))
    return kinds
