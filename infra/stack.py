"""The edge between Pulumi and the platform: read this stack's raw config once, report config errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pulumi
import pulumi.runtime
from pulumi.runtime import config as runtime_config

from infra.config import PlatformConfig, parse_stack_config
from infra.config.problems import ConfigError
from infra.secrets import secret_keys, secret_values


def raw_stack_config() -> dict[str, str]:
    """Every config value of this run, as Pulumi passes them (env for real runs, set config under mocks)."""
    return {**pulumi.runtime.get_config_env(), **runtime_config.CONFIG.get()}


def load_config() -> tuple[PlatformConfig, dict[str, str]]:
    """The parsed config, and the plaintexts of the values Pulumi marked secret (see infra/secrets.py)."""
    raw = raw_stack_config()
    cfg = parse_stack_config(pulumi.get_stack(), raw)
    for warning in cfg.warnings:
        pulumi.log.warn(warning)
    return cfg, secret_values(raw, secret_keys(raw))


@contextlib.contextmanager
def config_errors_reported() -> Iterator[None]:
    """A config mistake is not a crash: RunError makes Pulumi print the message alone, no traceback."""
    try:
        yield
    except ConfigError as error:
        raise pulumi.RunError(str(error)) from None
