"""tpu-platform: TPU as a service on Google Cloud, one stack per environment.

Also the entry point of the bootstrap project: bootstrap/Pulumi.yaml sets `main: ..`, so Pulumi runs this
file from the repository root (on the import path), and it hands over to the `bootstrap` package.
"""

import gc
import runpy

import pulumi

from bootstrap import PROJECT as BOOTSTRAP_PROJECT
from infra.platform import build_platform, export_all
from infra.stack import config_errors_reported, load_config

# The SDK leaves some 300 objects of cyclic garbage per resource (futures, tasks, closures): with Python's
# default of a collection every 700 new objects, a 300-VM plan spent 5 of its 18 s of CPU in the collector;
# every 50,000 objects, 1.6 s (benchmarks/plan_scale.py). The garbage is still collected, only in bigger rounds.
gc.set_threshold(50_000, 20, 100)

if pulumi.get_project() == BOOTSTRAP_PROJECT:
    runpy.run_module("bootstrap", run_name="__main__")
else:
    with config_errors_reported():
        config, secrets = load_config()
        export_all(build_platform(config, secrets), secrets)
