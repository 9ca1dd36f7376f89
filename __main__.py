"""tpu-platform: TPU as a service on Google Cloud, one stack per environment."""

from infra.platform import build_platform, export_all
from infra.stack import load_config

export_all(build_platform(load_config()))
