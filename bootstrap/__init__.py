"""The run-once bootstrap project; its Pulumi.yaml (`main: ..`) runs the repository root's __main__.py."""

PROJECT = "tpu-platform-bootstrap"  # `name:` in bootstrap/Pulumi.yaml; the root __main__.py routes on it
