"""Settings: defaults that run the demo, the public variable names, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from durapay.config import SIMULATOR_API_KEY, SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("DURAPAY_"):
            monkeypatch.delenv(name)


def test_defaults_need_nothing_set() -> None:
    settings = load_settings()
    assert settings.redis_url == ""  # empty = embedded Valkey
    assert settings.gateway.api_key.get_secret_value() == SIMULATOR_API_KEY
    assert settings.gateway.base_url.endswith("/api/phoenix-0.0/psp/api/v1")


def test_public_variable_names(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "DURAPAY_REDIS_URL": "redis://127.0.0.1:7000/2",
        "DURAPAY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
        "DURAPAY_GATEWAY__BASE_URL": "https://xpaysandbox.nexigroup.com/api/phoenix-0.0/psp/api/v1/",
        "DURAPAY_GATEWAY__API_KEY": "secret-key",
        "DURAPAY_GATEWAY__TIMEOUT": "4.5",
        "DURAPAY_RECEIVER__PUBLIC_URL": "https://shop.example/durapay/notifications",
        "DURAPAY_API__KEY": "control-key",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:7000/2"
    assert settings.broker_url.startswith("amqp://")
    assert settings.gateway.base_url == "https://xpaysandbox.nexigroup.com/api/phoenix-0.0/psp/api/v1"
    assert settings.gateway.api_key.get_secret_value() == "secret-key"
    assert "secret-key" not in repr(settings)
    assert settings.gateway.timeout == 4.5
    assert settings.receiver.public_url == "https://shop.example/durapay/notifications"
    assert settings.api.key.get_secret_value() == "control-key"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DURAPAY_GATEWAY__TIMEOUT", "soon", "DURAPAY_GATEWAY__TIMEOUT: Input should be a valid number"),
        ("DURAPAY_GATEWAY__TIMEOUT", "0", "DURAPAY_GATEWAY__TIMEOUT: Input should be greater than 0"),
        ("DURAPAY_GATEWAY__BASE_URL", "ftp://x", "DURAPAY_GATEWAY__BASE_URL: must be an http:// or https:// URL"),
        ("DURAPAY_REDIS_URL", "localhost:6379", "DURAPAY_REDIS_URL: must start with redis://"),
        ("DURAPAY_REDIS_URL", "amqp://x", "DURAPAY_REDIS_URL: flow records live in Redis"),
        ("DURAPAY_API__PORT", "70000", "DURAPAY_API__PORT: Input should be less than or equal to 65535"),
        ("DURAPAY_RETRY__MAX_ATTEMPTS", "0", "DURAPAY_RETRY__MAX_ATTEMPTS: Input should be greater than or equal to 1"),
        ("DURAPAY_GATEWAY__TIMEOUTS", "3", "DURAPAY_GATEWAY__TIMEOUTS: Extra inputs are not permitted"),
        ("DURAPAY_GATEWAY", "{bad", "DURAPAY_GATEWAY: not valid JSON"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_the_cli_prints_one_line_and_exits_2() -> None:
    env = {"DURAPAY_GATEWAY__TIMEOUT": "soon", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", "from durapay.service.cli import main; main()", "config"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "durapay: configuration error: DURAPAY_GATEWAY__TIMEOUT: Input should be a valid number, "
        "unable to parse string as a number"
    ]


def test_a_lease_shorter_than_one_gateway_call_is_refused() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"engine": {"lease_seconds": 12}, "gateway": {"timeout": 10, "connect_timeout": 3}})
    message = str(refused.value)
    assert message.startswith("DURAPAY_ENGINE__LEASE_SECONDS: must exceed one gateway call") and "13s" in message
    assert "\n" not in message
    assert load_settings({"engine": {"lease_seconds": 14}}).engine.lease_seconds == 14


def test_a_webhook_lease_within_twice_an_attempts_deadline_is_refused() -> None:
    """A delivery task starts attempts until half its lease, each lasting up to its deadline (connect +
    timeout): a lease of twice the deadline or less lets another worker take a delivery still being sent."""
    with pytest.raises(SettingsError) as refused:
        load_settings({"webhooks": {"lease_seconds": 26, "timeout": 10, "connect_timeout": 3}})
    message = str(refused.value)
    assert message.startswith("DURAPAY_WEBHOOKS__LEASE_SECONDS: must exceed twice an attempt's deadline")
    assert "DURAPAY_WEBHOOKS__CONNECT_TIMEOUT + DURAPAY_WEBHOOKS__TIMEOUT = 13s" in message and "26s" in message
    longer = {"lease_seconds": 26.5, "timeout": 10, "connect_timeout": 3}
    assert load_settings({"webhooks": longer}).webhooks.lease_seconds == 26.5
    assert load_settings().webhooks.lease_seconds > 2 * 13  # the defaults pass


def test_a_webhook_retry_window_that_reaches_the_events_retention_is_refused() -> None:
    """The scheduler trims events older than their retention: a delivery still being retried then would
    find its event gone and be dropped. Its last attempt may come up to the longest delay, with its jitter,
    after the retry days (a Retry-After never moves it past the window)."""
    with pytest.raises(SettingsError) as refused:
        load_settings({"events": {"retention": "4d"}, "webhooks": {"retry_days": 3.6}})  # 3.6 + 0.5 (10 h + 20%)
    message = str(refused.value)
    assert message.startswith("DURAPAY_WEBHOOKS__RETRY_DAYS: ") and "DURAPAY_EVENTS__RETENTION (4 days)" in message
    assert "\n" not in message
    with pytest.raises(SettingsError, match="RETRY_DAYS"):
        load_settings({"events": {"retention_days": 5}, "webhooks": {"retry_delays": [0, 300000]}})  # 3.5 days, 4.2 with jitter
    assert load_settings({"events": {"retention_days": 4}, "webhooks": {"retry_days": 3}}).events.retention == 4 * 86400
    assert load_settings().webhooks.retry_days == 3 and load_settings().events.retention == 7 * 86400
    short = {"retry_days": 60 / 86400, "retry_delays": [0, 10]}  # one minute of retries, 12 s at most after it
    assert load_settings({"events": {"retention": "2m"}, "webhooks": short}).events.retention == 120


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("120s", 120), ("3600", 3600), (" 2D ", 172800), (7200, 7200)],
)
def test_retentions_read_as_durations(written: object, seconds: float) -> None:
    """Issue 29, item 5: every retention is a duration (a unit, or seconds), read the same from the
    environment and from code."""
    loaded = load_settings(
        {"engine": {"retention": written}, "events": {"retention": written}, "schedules": {"retention": written}}
        | ({"webhooks": {"retry_days": 0.001, "retry_delays": [0, 10]}} if seconds < 86400 * 4 else {})
        | {"reconcile": {"daily": False}}  # a retention shorter than its reach is refused with it on (below)
    )
    assert loaded.engine.retention == loaded.events.retention == loaded.schedules.retention == seconds


def test_retentions_are_refused_outside_their_documented_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranges README states (10s to 3650d; the events' to 90d), the older ``_DAYS`` form still read in
    days, and a clear message for what is not a duration or names both forms."""
    quick = {"webhooks": {"retry_days": 0.0001, "retry_delays": [0]}, "reconcile": {"daily": False}}
    for group, highest in (("engine", "3650d"), ("events", "90d"), ("schedules", "3650d")):
        assert load_settings({group: {"retention": "10s"}, **quick}).model_dump()[group]["retention"] == 10
        assert load_settings({group: {"retention": highest}}).model_dump()[group]["retention"] == float(highest[:-1]) * 86400
        for wrong in ("9s", f"{int(highest[:-1]) + 1}d"):
            with pytest.raises(SettingsError, match=f"DURAPAY_{group.upper()}__RETENTION: "):
                load_settings({group: {"retention": wrong}, **quick})
    with pytest.raises(SettingsError, match=r"DURAPAY_ENGINE__RETENTION: '3 weeks' is not a duration \(e.g. 30d, 12h"):
        load_settings({"engine": {"retention": "3 weeks"}})
    monkeypatch.setenv("DURAPAY_ENGINE__RETENTION_DAYS", "3")
    monkeypatch.setenv("DURAPAY_RECEIVER__EVENT_TTL_SECONDS", "2h")
    assert load_settings().engine.retention == 3 * 86400 and load_settings().receiver.event_ttl_seconds == 7200
    monkeypatch.setenv("DURAPAY_ENGINE__RETENTION", "3d")
    with pytest.raises(SettingsError, match="DURAPAY_ENGINE: set __RETENTION or __RETENTION_DAYS"):
        load_settings()


def test_a_duration_error_names_the_variable_set_and_its_range_in_the_documented_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29 review: the errors named DURAPAY_ENGINE__RETENTION when DURAPAY_ENGINE__RETENTION_DAYS was
    set, stated the range in seconds ("less than or equal to 315360000"), said the same of nan and inf,
    refused 10.5s for the receiver's TTL only, and the reconciliation's retention was days only."""
    quick = {"webhooks": {"retry_days": 0.0001, "retry_delays": [0]}}
    cases = {
        ("engine", "retention_days", "4000"): r"DURAPAY_ENGINE__RETENTION_DAYS: 4000 days is more than 3650d",
        ("engine", "retention_days", "0.0001"): r"DURAPAY_ENGINE__RETENTION_DAYS: 0.0001 days is less than 10s",
        ("engine", "retention", "5s"): r"DURAPAY_ENGINE__RETENTION: 5s is less than 10s",
        ("events", "retention", "91d"): r"DURAPAY_EVENTS__RETENTION: 91d is more than 90d",
        ("schedules", "retention", "nan"): r"DURAPAY_SCHEDULES__RETENTION: 'nan' is not a duration: a finite number",
        ("engine", "retention", "inf"): r"DURAPAY_ENGINE__RETENTION: 'inf' is not a duration: a finite number",
        ("engine", "retention", "1e400"): r"DURAPAY_ENGINE__RETENTION: '1e400' is not a duration: a finite number",
        ("reconcile", "retention_days", "4000"): r"DURAPAY_RECONCILE__RETENTION_DAYS: 4000 days is more than 3650d",
        ("receiver", "event_ttl_seconds", "5s"): r"DURAPAY_RECEIVER__EVENT_TTL_SECONDS: 5s is less than 10s",
    }
    for (group, name, value), message in cases.items():
        monkeypatch.setenv(f"DURAPAY_{group.upper()}__{name.upper()}", value)
        with pytest.raises(SettingsError, match=f"^{message}"):
            load_settings(quick)
        monkeypatch.delenv(f"DURAPAY_{group.upper()}__{name.upper()}")
    assert load_settings({"receiver": {"event_ttl_seconds": "10.5s"}}).receiver.event_ttl_seconds == 11, "rounded up"
    assert load_settings({"reconcile": {"retention": "12h"}}).reconcile.retention == 43200
    monkeypatch.setenv("DURAPAY_RECONCILE__RETENTION_DAYS", "30d")  # the older name, read as a duration too
    assert load_settings().reconcile.retention == 30 * 86400 and load_settings().reconcile.retention_days == 30


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("DURAPAY_REDIS_URLL", "DURAPAY_REDIS_URLL: not a durapay setting; did you mean DURAPAY_REDIS_URL?"),
        ("DURAPAY_BROKERURL", "DURAPAY_BROKERURL: not a durapay setting; did you mean DURAPAY_BROKER_URL?"),
        ("DURAPAY_GATEWAY_TIMEOUT", "DURAPAY_GATEWAY_TIMEOUT: not a durapay setting; did you mean DURAPAY_GATEWAY__TIMEOUT?"),
        ("DURAPAY_GATEWAYS__TIMEOUT", "DURAPAY_GATEWAYS__TIMEOUT: not a durapay setting; did you mean DURAPAY_GATEWAY__TIMEOUT?"),
        ("durapay_data_dirr", "durapay_data_dirr: not a durapay setting; did you mean DURAPAY_DATA_DIR?"),
        ("DURAPAY_REDIS_URL__HOST", "DURAPAY_REDIS_URL__HOST: not a durapay setting; did you mean DURAPAY_REDIS_URL?"),
        ("DURAPAY_SHOP_SECRET", "DURAPAY_SHOP_SECRET: not a durapay setting (docs/configuration.md lists them"),
    ],
)
def test_an_unknown_variable_is_refused_naming_the_setting_meant(
    monkeypatch: pytest.MonkeyPatch, name: str, message: str
) -> None:
    """A misspelt variable was ignored: DURAPAY_REDIS_URLL left the embedded Valkey in use, unsaid."""
    monkeypatch.setenv(name, "redis://127.0.0.1:7000/2")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_test_and_tool_variables_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    from durapay.config.settings import TOOL_VARIABLES

    assert "DURAPAY_MODEL_EXAMPLES" in TOOL_VARIABLES and "DURAPAY_CHAOS_FSYNC_LOG" in TOOL_VARIABLES
    for name in [*TOOL_VARIABLES, "DURAPAY_TEST_AMQP_URL", "DURAPAY_TEST_ANYTHING_NEW"]:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("DURAPAY_REDIS_URL", "redis://127.0.0.1:7000/2")
    monkeypatch.setenv("DURAPAY_GATEWAY", '{"timeout": 4}')
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:7000/2" and settings.gateway.timeout == 4


def test_the_cli_refuses_an_unknown_variable_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from durapay.service.cli import main; main()", "config"],
        capture_output=True,
        text=True,
        env={"DURAPAY_REDIS_URLL": "redis://127.0.0.1:7000/2", "PATH": ""},
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[0]
        .startswith("durapay: configuration error: DURAPAY_REDIS_URLL: not a durapay setting; did you mean DURAPAY_REDIS_URL?")
    )


def test_every_durapay_variable_the_code_reads_is_a_setting_or_a_documented_tool_variable() -> None:
    """A test or tool that reads a new ``DURAPAY_*`` knob must list it in TOOL_VARIABLES (or name it
    ``DURAPAY_TEST_*``), or every process it runs in would refuse to start; each one is documented."""
    import re
    from pathlib import Path

    from durapay.config.settings import TOOL_PREFIX, TOOL_VARIABLES, check_variables

    root = Path(__file__).resolve().parents[2]
    read = re.compile(r"""(?:getenv|environ\.get|environ\[|LOG_VARIABLE =)\(?\s*["'](DURAPAY_[A-Z0-9_]+)["']""")
    sources = [path for folder in ("config", "gateway", "service", "simulator", "tasks", "workflows", "tests", "bench")
               for path in (root / folder).rglob("*.py")]  # fmt: skip
    names = {name for path in sources for name in read.findall(path.read_text())}
    assert {"DURAPAY_MODEL_EXAMPLES", "DURAPAY_SPEC_FILE", "DURAPAY_CHAOS_FSYNC_LOG", "DURAPAY_REDIS_URL"} <= names
    check_variables(dict.fromkeys(names, "1"))  # raises for a knob that is neither
    documented = (root / "docs" / "configuration.md").read_text()
    assert all(f"`{name}`" in documented for name in TOOL_VARIABLES) and f"`{TOOL_PREFIX}*`" in documented


def test_a_retention_shorter_than_the_daily_reconciliations_reach_is_refused() -> None:
    """Review of issue 25: with the daily run on by default, DURAPAY_ENGINE__RETENTION=12h (valid alone)
    made every daily run fail (its window starts before the kept flows); the start now refuses it, naming
    both settings and what to set. With the daily run off, or a retention that reaches, it is taken."""
    with pytest.raises(SettingsError) as refused:
        load_settings({"engine": {"retention": "12h"}, "reconcile": {"daily": True}})
    said = str(refused.value)
    assert said.startswith("DURAPAY_ENGINE__RETENTION: 12h ") and "DURAPAY_RECONCILE__WINDOW_HOURS=24" in said
    assert "at least 49h" in said and "DURAPAY_RECONCILE__DAILY=false" in said
    with pytest.raises(SettingsError, match="at least 31h"):
        load_settings({"engine": {"retention": "30h"}, "reconcile": {"daily": True, "window_hours": 6}})
    assert load_settings({"engine": {"retention": "49h"}, "reconcile": {"daily": True}}).engine.retention == 49 * 3600
    assert load_settings({"engine": {"retention": "12h"}, "reconcile": {"daily": False}}).engine.retention == 12 * 3600


def test_terminals_are_declared_as_json_beside_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "DURAPAY_TERMINALS",
        '{"it-web": {"api_key": "key-it-web", "rate_per_second": 20, "burst": 5, "outage_seconds": 600},'
        ' "de": {"api_key": "key-de", "base_url": "https://de.example/api/"}}',
    )
    settings = load_settings()
    assert settings.terminal_names == ["default", "it-web", "de"]
    assert settings.terminals["de"].base_url == "https://de.example/api"
    assert settings.terminals["it-web"].outage_seconds == 600
    monkeypatch.delenv("DURAPAY_TERMINALS")
    assert load_settings().terminal_names == ["default"], "none declared: default alone, as before"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '{"it": {"api_kee": "key-it"}}',
            "DURAPAY_TERMINALS: terminal 'it': 'api_kee' is not a terminal field; did you mean api_key?",
        ),
        ('{"it": {"base_url": "https://it.example"}}', "DURAPAY_TERMINALS: terminal 'it': api_key is required"),
        ('{"It": {"api_key": "key-it"}}', "DURAPAY_TERMINALS: 'It' is not a terminal name"),
        ('{"default": {"api_key": "key-it"}}', "DURAPAY_TERMINALS: 'default' is the terminal of DURAPAY_GATEWAY__BASE_URL"),
        ('{"it": {"api_key": "key-it", "burst": 0}}', "DURAPAY_TERMINALS: terminal 'it': burst: Input should be greater"),
        ('{"it": {"api_key": "key-it", "outage_seconds": 1}}', "DURAPAY_TERMINALS: terminal 'it': outage_seconds:"),
    ],
)
def test_a_misspelt_or_bad_terminal_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv("DURAPAY_TERMINALS", value)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value).startswith(message), str(refused.value)
    assert "key-it" not in str(refused.value), "a terminal's key is a secret"


def test_a_terminals_fields_may_be_variables_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DURAPAY_TERMINALS__<NAME>__<FIELD>`` (a key from a secret store), what ``durapay config`` prints."""
    monkeypatch.setenv("DURAPAY_TERMINALS__IT__API_KEY", "key-of-it")
    monkeypatch.setenv("DURAPAY_TERMINALS__IT__RATE_PER_SECOND", "5")
    settings = load_settings()
    assert settings.terminal_names == ["default", "it"]
    assert settings.terminals["it"].api_key.get_secret_value() == "key-of-it" and settings.terminals["it"].rate_per_second == 5
    monkeypatch.setenv("DURAPAY_TERMINALS__IT__API_KEE", "key-of-it")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value).startswith("DURAPAY_TERMINALS__IT__API_KEE: not a terminal setting")
    assert "did you mean DURAPAY_TERMINALS__IT__API_KEY?" in str(refused.value)
