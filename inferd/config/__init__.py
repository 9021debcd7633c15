"""Typed configuration: the records (`settings`), how a TOML file becomes them (`parsing`), and a config
made from model folders given on the command line (`model_folders`)."""

from ..typed_tables import ConfigError
from .parsing import load_config, parse_config, parse_model
from .settings import (
    DEFAULT_TIER_PRIORITIES,
    AdapterConfig,
    AuthConfig,
    ModelConfig,
    ServerConfig,
    TenantConfig,
    TierConfig,
    TracingConfig,
    default_config,
)

__all__ = ["DEFAULT_TIER_PRIORITIES", "AdapterConfig", "AuthConfig", "ConfigError", "ModelConfig", "ServerConfig", "TenantConfig",
           "TierConfig", "TracingConfig", "default_config", "load_config", "parse_config", "parse_model"]
