"""``config.secrets``: every secret found, in loaded settings and in the environment before they load,
and the one redaction of them."""

from __future__ import annotations

import json

from durapay.config import load_settings
from durapay.config.secrets import masked_url, redact, secrets_in, secrets_of


def test_every_kind_of_secret_is_found_in_the_settings_and_in_the_environment() -> None:
    environ = {
        "DURAPAY_REDIS_URL": "redis://:pw-redis-1@a:1,b:2/0",
        "DURAPAY_BROKER_URL": "amqp://user:pw-broker-2@mq/",
        "DURAPAY_API__KEY": "key-operator-3",
        "DURAPAY_API__KEYS": json.dumps({"key-read-4": "read"}),
        "DURAPAY_GATEWAY": json.dumps({"api_key": "key-gateway-5"}),
        "DURAPAY_WEBHOOKS__ENDPOINTS": json.dumps([{"url": "https://h.example/x", "secret": "whsec_c2VjcmV0LXNpeC0xMjM0NTY="}]),
        "DURAPAY_ENGINE__KEY_PREFIX": "shop",
        "HOME": "/root",
    }
    found = set(secrets_in(environ))
    assert {
        "pw-redis-1",
        "pw-broker-2",
        "key-operator-3",
        "key-read-4",
        "key-gateway-5",
        "whsec_c2VjcmV0LXNpeC0xMjM0NTY=",
    } <= found
    assert "shop" not in found and "/root" not in found
    settings = load_settings(
        {
            "redis_url": "redis://:pw-redis-1@127.0.0.1:6390/0",
            "api": {"key": "key-operator-3", "keys": {"key-read-4": "read"}},
            "gateway": {"api_key": "key-gateway-5"},
        }
    )
    assert {"pw-redis-1", "key-operator-3", "key-read-4", "key-gateway-5"} <= set(secrets_of(settings))


def test_redact_and_masked_url() -> None:
    assert redact("key KEY-OPERATOR-3 and key-operator-3 in key-operator-33", ["key-operator-3", "key-operator-33"]) == (
        "key *** and *** in ***"
    )
    assert masked_url("redis://:pw@a:1,b:2/0 and amqp://u:p2@mq/") == "redis://:***@a:1,b:2/0 and amqp://u:***@mq/"
    assert masked_url("https://example.com/a:b@c") == "https://example.com/a:b@c", "a path is no user information"
