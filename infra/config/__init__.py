"""A stack's settings, parsed and validated once into frozen objects.

- `model`: the frozen objects components read (`PlatformConfig` and its parts), each setting's one
  declaration (type, default, bounds, description);
- `settings`: the declarations as rows, from which the JSON Schema of stack files and the settings table
  of docs/stack-settings.md are made;
- `reader`: `parse_stack_config`, raw Pulumi config -> `PlatformConfig` or one `ConfigError`;
- `rules`: checks across settings (the TPU catalog, production, names);
- `docs`: the JSON Schema and the settings table, generated.

Components never read `pulumi.Config`; they take these objects, so they are testable with plain values.
"""

from infra.config.model import (
    BILLING_ACCOUNT,
    BUCKET_PURPOSES,
    GCP_PROJECT_ID,
    PLATFORM_ACCOUNTS,
    PROJECT,
    ArtifactSettings,
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    Env,
    NetworkSettings,
    PlatformConfig,
    ScheduleSettings,
    Threshold,
    TpuVmSettings,
    WorkloadSettings,
    service_account_id,
)
from infra.config.problems import ConfigError
from infra.config.reader import parse_stack_config

__all__ = [
    "BILLING_ACCOUNT",
    "BUCKET_PURPOSES",
    "GCP_PROJECT_ID",
    "PLATFORM_ACCOUNTS",
    "PROJECT",
    "ArtifactSettings",
    "AutomationSettings",
    "BucketSettings",
    "BudgetSettings",
    "ConfigError",
    "Env",
    "NetworkSettings",
    "PlatformConfig",
    "ScheduleSettings",
    "Threshold",
    "TpuVmSettings",
    "WorkloadSettings",
    "parse_stack_config",
    "service_account_id",
]
