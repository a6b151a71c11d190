"""Public names of a package loaded on first use (PEP 562), so that importing the package, or any
module under it, loads only what is used: ``import durapay.workflows.webhooks.signing`` (a merchant's
receiver) or the CLI's shell completion no longer pays for the engine, Celery and the HTTP clients.

A package lists where each of its names lives and hands the two hooks to Python::

    __getattr__, __dir__ = lazy_names(__name__, {"Engine": "durapay.workflows.engine.api", ...})

and keeps the same imports under ``if TYPE_CHECKING:`` for type checkers and readers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: a name of ``homes`` (``module`` or
    ``module:attribute``) is imported when first asked for, then kept as a plain attribute."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = home.partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
