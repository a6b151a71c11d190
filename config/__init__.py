"""Settings, the Celery app factory and logging: the one place configuration is read."""

from durapay.config.settings import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    GATEWAY_PATH_PREFIX,
    SIMULATOR_API_KEY,
    ApiSettings,
    EngineSettings,
    GatewaySettings,
    ReceiverSettings,
    RetrySettings,
    Settings,
    SettingsError,
    load_settings,
)

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "GATEWAY_PATH_PREFIX",
    "SIMULATOR_API_KEY",
    "ApiSettings",
    "EngineSettings",
    "GatewaySettings",
    "ReceiverSettings",
    "RetrySettings",
    "Settings",
    "SettingsError",
    "load_settings",
]
