"""``durapay config`` never prints a key: the role keys of ``DURAPAY_API__KEYS`` are counted, not shown."""

from __future__ import annotations

import pytest

from durapay.config import SettingsError, load_settings
from durapay.service.cli.config_cmd import effective


def test_role_keys_are_counted_not_printed() -> None:
    values = effective(load_settings({"api": {"key": "operator-0123", "keys": {"reader-secret-0123": "read"}}}))
    assert values["DURAPAY_API__KEYS"] == "(1 set: read)"
    assert "reader-secret-0123" not in str(values) and "operator-0123" not in str(values)


def test_keys_come_from_the_environment_as_json_and_roles_are_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURAPAY_API__KEYS", '{"reader-key-0123": "read", "other-key-0123": "operator"}')
    assert load_settings().api.keys == {"reader-key-0123": "read", "other-key-0123": "operator"}
    monkeypatch.setenv("DURAPAY_API__KEYS", '{"reader-key-0123": "admin"}')
    with pytest.raises(SettingsError):
        load_settings()
