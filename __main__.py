"""tpu-platform: TPU as a service on Google Cloud, one stack per environment.

Also the entry point of the bootstrap project: bootstrap/Pulumi.yaml sets `main: ..`, so Pulumi runs this
file from the repository root (on the import path), and it hands over to the `bootstrap` package.
"""

import runpy

import pulumi

from bootstrap import PROJECT as BOOTSTRAP_PROJECT
from infra.platform import build_platform, export_all
from infra.stack import config_errors_reported, load_config

if pulumi.get_project() == BOOTSTRAP_PROJECT:
    runpy.run_module("bootstrap", run_name="__main__")
else:
    with config_errors_reported():
        config, secrets = load_config()
        export_all(build_platform(config, secrets), secrets)
