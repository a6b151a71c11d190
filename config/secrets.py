"""Every secret durapay is given, and the one rule that keeps them out of what it prints.

Why: ``durapay config`` printed ``DURAPAY_REDIS_URL`` and ``DURAPAY_BROKER_URL`` with their passwords,
and a ``DURAPAY_API__KEYS`` entry with a mistyped role stopped the start naming the key itself (the
validation error's location is the entry's key). A secret must not reach a terminal, a CI log or a
support ticket because a setting was wrong. The secrets are:

* the API keys (``DURAPAY_API__KEY``, every key of ``DURAPAY_API__KEYS``), the gateway's key
  (``DURAPAY_GATEWAY__API_KEY``), the configured webhook endpoints' secrets
  (``DURAPAY_WEBHOOKS__ENDPOINTS``), the card keys (``DURAPAY_CARD__KEYS``): every ``SecretStr`` of the
  settings and the keys of the roles map;
* the password of every URL (``DURAPAY_REDIS_URL``, ``DURAPAY_BROKER_URL``, any other).

:func:`secrets_of` finds them in loaded settings; :func:`secrets_in` in the environment, for an error
met before the settings load (a variable ending in ``KEY``, ``KEYS``, ``SECRET`` or ``PASSWORD``, the
values under such names in a JSON variable, a URL's password). :func:`redact` replaces each in a text
by ``***``. The CLI's one error printer (``service.cli._common.Output.fail``) and ``durapay config``
apply it to everything they print; ``load_settings`` names a role entry by its place, never its key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, SecretStr

HIDDEN = "***"
#: A URL's user information: ``scheme://user:password@host`` (the password is group 1).
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]*:([^@\s/]+)@", re.IGNORECASE)
#: Names (of variables, or of keys inside a JSON variable) whose values are secrets.
_SECRET_NAME = re.compile(r"(^|_)(API_?KEY|KEY|KEYS|SECRET|PASSWORD|TOKEN)$", re.IGNORECASE)
#: Shorter values are not searched for (a one-letter "secret" would blank every text); settings refuse
#: keys this short anyway.
SHORTEST = 4


def url_passwords(text: str) -> list[str]:
    """The passwords of every URL in ``text`` (a cluster's ``redis://:pw@a:1,b:2`` counts once)."""
    return [match.group(1) for match in _URL_PASSWORD.finditer(text)]


def _walk(value: Any, found: list[str]) -> None:
    if isinstance(value, SecretStr):
        found.append(value.get_secret_value())
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            inner = getattr(value, name)
            if name == "keys" and isinstance(inner, Mapping):
                found.extend(str(key) for key in inner)  # the role map: its keys are the secrets
            _walk(inner, found)
    elif isinstance(value, Mapping):
        for inner in value.values():
            _walk(inner, found)
    elif isinstance(value, list | tuple):
        for inner in value:
            _walk(inner, found)
    elif isinstance(value, str):
        found.extend(url_passwords(value))


def secrets_of(settings: BaseModel) -> list[str]:
    """Every secret the loaded settings hold."""
    found: list[str] = []
    _walk(settings, found)
    return _kept(found)


def _json_secrets(value: Any, found: list[str], named: bool = False) -> None:
    if isinstance(value, SecretStr | BaseModel):
        found.extend(secrets_of(value) if isinstance(value, BaseModel) else [value.get_secret_value()])
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            secret_name = bool(_SECRET_NAME.search(str(key)))
            if str(key).lower() == "keys" and isinstance(inner, Mapping):
                found.extend(str(name) for name in inner)
            _json_secrets(inner, found, secret_name)
    elif isinstance(value, list):
        for inner in value:
            _json_secrets(inner, found, named)
    elif isinstance(value, str):
        if named:
            found.append(value)
        found.extend(url_passwords(value))


def secrets_given(value: Any) -> list[str]:
    """Every secret a JSON-like value of settings carries (``load_settings``' overrides, a group's JSON):
    the values under secret names, the keys of a ``keys`` map, URL passwords."""
    found: list[str] = []
    _json_secrets(value, found)
    return _kept(found)


def secrets_in(environ: Mapping[str, str], prefix: str = "DURAPAY_") -> list[str]:
    """Every secret the ``DURAPAY_*`` variables carry, read without loading the settings."""
    found: list[str] = []
    for name, value in environ.items():
        if not name.upper().startswith(prefix):
            continue
        found.extend(url_passwords(value))
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        secret_name = bool(_SECRET_NAME.search(name))
        if isinstance(parsed, Mapping | list):
            _json_secrets(parsed, found, secret_name)
            if name.upper().endswith("KEYS") and isinstance(parsed, Mapping):
                found.extend(str(key) for key in parsed)
        if secret_name:
            found.append(value)  # whole, as given (a JSON that did not parse as well)
    return _kept(found)


def _kept(found: Iterable[str]) -> list[str]:
    return sorted({secret for secret in found if len(secret) >= SHORTEST}, key=len, reverse=True)


def masked_url(text: str) -> str:
    """``text`` with the password of every URL in it as ``***`` (``redis://:***@host:6379/0``)."""
    return _URL_PASSWORD.sub(lambda match: match.group(0).replace(":" + match.group(1) + "@", ":" + HIDDEN + "@"), text)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first: one may hold another) replaced by ``***``; its
    upper-cased form too (a validation error names a variable in capitals)."""
    for secret in _kept(secrets):
        text = text.replace(secret, HIDDEN)
        if secret.upper() != secret:
            text = text.replace(secret.upper(), HIDDEN)
    return text
