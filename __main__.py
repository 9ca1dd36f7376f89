"""tpu-platform: TPU as a service on Google Cloud, one stack per environment."""

from infra.platform import build_platform, export_all
from infra.stack import config_errors_reported, load_config

with config_errors_reported():
    config, secrets = load_config()
    export_all(build_platform(config, secrets), secrets)
