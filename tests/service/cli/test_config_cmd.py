"""``durapay config`` and every start-up error print no secret: the role keys of ``DURAPAY_API__KEYS`` are
counted, not shown; a URL's password is ``***``; a mistyped role entry is named by its place, not its key;
and the one error printer masks whatever an error quotes (``config.secrets``)."""

from __future__ import annotations

import json
import os

import pytest

from durapay.config import SettingsError, load_settings
from durapay.service.cli.config_cmd import effective
from tests.service.cli.conftest import invoke


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


#: A secret of each kind, each set below; none may appear in anything a command prints.
SECRETS = {
    "DURAPAY_REDIS_URL": "redispw-s3cret-1",
    "DURAPAY_BROKER_URL": "brokerpw-s3cret-2",
    "DURAPAY_API__KEY": "operator-s3cret-key-3",
    "DURAPAY_API__KEYS": "reader-s3cret-key-4",
    "DURAPAY_GATEWAY__API_KEY": "gateway-s3cret-key-5",
    "DURAPAY_WEBHOOKS__ENDPOINTS": "whsec_c2VjcmV0LXdlYmhvb2stNg==",
    # A card key's secret part (its id, "k7", names it and is no secret).
    "DURAPAY_CARD__KEYS": "Y2FyZC1rZXktczNjcmV0LTctLXRoaXJ0eS10d28hISE",
}


def secret_environment(monkeypatch: pytest.MonkeyPatch, *, role: str = "read") -> None:
    for name in list(os.environ):
        if name.startswith("DURAPAY_"):
            monkeypatch.delenv(name)
    values = {
        "DURAPAY_REDIS_URL": f"redis://:{SECRETS['DURAPAY_REDIS_URL']}@127.0.0.1:9/0",
        "DURAPAY_BROKER_URL": f"redis://durapay:{SECRETS['DURAPAY_BROKER_URL']}@127.0.0.1:9/1",
        "DURAPAY_API__KEY": SECRETS["DURAPAY_API__KEY"],
        "DURAPAY_API__KEYS": json.dumps({"dashboard-0123456789": "read", SECRETS["DURAPAY_API__KEYS"]: role}),
        "DURAPAY_GATEWAY__API_KEY": SECRETS["DURAPAY_GATEWAY__API_KEY"],
        "DURAPAY_WEBHOOKS__ENDPOINTS": json.dumps(
            [{"url": "https://hooks.example.com/h", "secret": SECRETS["DURAPAY_WEBHOOKS__ENDPOINTS"]}]
        ),
        "DURAPAY_CARD__KEYS": json.dumps([f"k7:{SECRETS['DURAPAY_CARD__KEYS']}"]),
        "DURAPAY_RECONCILE__DAILY": "false",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def leaked(text: str) -> list[str]:
    return [
        name for name, secret in SECRETS.items() if secret in text or secret.upper() in text or "dashboard-0123456789" in text
    ]


def test_durapay_config_prints_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37, finding 4: the Redis and broker URLs were printed with their passwords."""
    secret_environment(monkeypatch)
    for args in (["config"], ["config", "--json"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        assert leaked(result.output) == [], result.output
    shown = json.loads(invoke("config", "--json").stdout)
    assert shown["DURAPAY_REDIS_URL"] == "redis://:***@127.0.0.1:9/0"
    assert shown["DURAPAY_BROKER_URL"] == "redis://durapay:***@127.0.0.1:9/1"
    assert json.loads(shown["DURAPAY_WEBHOOKS__ENDPOINTS"])[0]["secret"] == "(set)"
    assert shown["DURAPAY_API__KEYS"] == "(2 set: read, read)"


@pytest.mark.parametrize("command", [["config"], ["config", "--json"], ["flows", "ls"], ["api"], ["worker"], ["scheduler"]])
def test_a_start_up_error_names_no_secret(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    """A role entry mistyped stopped the start naming the key itself (its location): now its place."""
    secret_environment(monkeypatch, role="reader")
    result = invoke(*command)
    assert result.exit_code == 2, result.output
    assert "entry 2 of 2 (its key is not shown) has role 'reader'" in result.output and "DURAPAY_API__KEYS" in result.output
    assert leaked(result.output) == [], result.output


def test_an_error_quoting_a_secret_prints_it_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever an error quotes (here redis-py's own message, a URL that does not parse), the printer masks it."""
    secret_environment(monkeypatch)
    monkeypatch.setenv(
        "DURAPAY_REDIS_URL", f"redis://:{SECRETS['DURAPAY_REDIS_URL']}@127.0.0.1:no{SECRETS['DURAPAY_API__KEY']}/0"
    )
    result = invoke("flows", "ls")
    assert result.exit_code == 2 and "Port could not be cast" in result.output, result.output
    assert leaked(result.output) == [], result.output
    with pytest.raises(SettingsError) as refused:
        load_settings({"api": {"keys": {SECRETS["DURAPAY_API__KEYS"]: "admin"}}})
    assert leaked(str(refused.value)) == [] and "entry 2 of 2" in str(refused.value)
