"""tpu-platform: TPU as a service on Google Cloud, one stack per environment.

Also the entry point of the bootstrap project and of the GKE engine's admin phase: bootstrap/Pulumi.yaml
and gke-admin/Pulumi.yaml set `main: ..`, so Pulumi runs this file from the repository root (on the import
path), and it hands over to the `bootstrap` package or to `infra.gke.admin`.
"""

import runpy

import pulumi

from bootstrap import PROJECT as BOOTSTRAP_PROJECT
from infra.gke.admin import GKE_ADMIN_PROJECT, build_admin
from infra.gke.controllers import fetch_from_environment
from infra.platform import build_platform, export_all
from infra.stack import config_errors_reported, load_config

if pulumi.get_project() == BOOTSTRAP_PROJECT:
    runpy.run_module("bootstrap", run_name="__main__")
elif pulumi.get_project() == GKE_ADMIN_PROJECT:
    with config_errors_reported():
        config, _ = load_config()
        export_all(build_admin(config, fetch_from_environment()))
else:
    with config_errors_reported():
        config, secrets = load_config()
        export_all(build_platform(config, secrets), secrets)
