"""tpu-platform bootstrap: run once (`cd bootstrap && pulumi up`) before the platform stacks.

Pulumi runs it through the repository root's __main__.py (bootstrap/Pulumi.yaml sets `main: ..`), so the
repository root is on the import path and the shared config reader is imported as a package.
"""

from bootstrap.program import build_bootstrap, load_bootstrap_config
from infra.platform import export_all
from infra.stack import config_errors_reported

with config_errors_reported():
    export_all(build_bootstrap(load_bootstrap_config()))
