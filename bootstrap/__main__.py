"""tpu-platform bootstrap: run once (`cd bootstrap && pulumi up`) before the platform stacks."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # share the platform's config reader

from bootstrap.program import build_bootstrap, load_bootstrap_config
from infra.platform import export_all
from infra.stack import config_errors_reported

with config_errors_reported():
    export_all(build_bootstrap(load_bootstrap_config()))
