"""The edge between Pulumi and the platform: read this stack's raw config, parse it once."""

from __future__ import annotations

import pulumi
import pulumi.runtime
from pulumi.runtime import config as runtime_config

from infra.config import PlatformConfig, parse_stack_config
from infra.schema import ConfigError


def raw_stack_config() -> dict[str, str]:
    """Every config value of this run, as Pulumi passes them (env for real runs, set config under mocks)."""
    return {**pulumi.runtime.get_config_env(), **runtime_config.CONFIG.get()}


def load_config() -> PlatformConfig:
    try:
        return parse_stack_config(pulumi.get_stack(), raw_stack_config())
    except ConfigError as error:
        # RunError prints the message alone: a config mistake is not a crash, so no traceback.
        raise pulumi.RunError(str(error)) from None
