"""The platform's runner on a TPU VM: it reads the desired run, starts it under the run contract,
stops it cleanly when the desired run changes, and records each run's state.

Standard library only, and Python 3.8 syntax and APIs: it runs on the TPU VM image's own Python
before anything is installed. The catalog (infra/catalog/tpu.yaml) knows only tpu-ubuntu2204-base's
(3.10); the other images' Python is undocumented, so the agent keeps to 3.8, what Ubuntu 20.04 ships.
Every module has `from __future__ import annotations`, so the
modern annotations are never evaluated.
"""
