"""The GKE engine's admin phase (infra/gke/admin.py), its own Pulumi project: `cd gke-admin && pulumi up`.

Pulumi runs this folder with only the folder on the import path; the repository root goes there too, so infra/
is imported as a package (as the policy pack does).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.gke.admin import build_admin
from infra.gke.controllers import fetch_from_environment
from infra.platform import export_all
from infra.stack import config_errors_reported, load_config

with config_errors_reported():
    config, _ = load_config()
    export_all(build_admin(config, fetch_from_environment()))
