"""The platform's runner on a TPU VM (docs/design-runs.md): stdlib only, runs on the image's Python (3.10+)."""
