"""The run contract's names: patterns for ids and image references, the instance metadata keys, the
environment a run gets, and its exit codes."""

from __future__ import annotations

import re

# --- Ids --------------------------------------------------------------------------------------------
# A stack run's id: segments of letters, digits, `.`, `_`, `-`, joined by `/` (`<stack>/<workload>/<vm>/<run>`).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
MAX_RUN_ID = 200
# A researcher's run id, stricter: one path part of the run's model and checkpoint prefixes and a log label;
# `tpu-runs` takes it from a flag and the agent from the request. Their run is `<member key>/<id>`.
REQUEST_RUN_ID = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?")
REQUEST_RUN_ID_RULE = "1-32 lowercase letters, digits and '-', starting with a letter"
# Who asks: "stack" for the stack's own run; a researcher (user:) or their group (group:) for a request.
REQUESTER = re.compile(r"stack|(user|group):[^\s@]+@[^\s@]+")
RESEARCHER = re.compile(r"(user|group):[^@\s:]+@[^@\s]+\.[a-z]{2,}")
SHA256 = re.compile(r"[0-9a-f]{64}")

# --- Image references -------------------------------------------------------------------------------
# Artifact Registry Docker images: `LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE` (Artifact Registry,
# "Push and pull images"); image path components as the OCI distribution spec names them; a digest is
# `sha256:` and 64 lowercase hex digits; a tag at most 128 characters (docker tag reference).
IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"{IMAGE_COMPONENT}(?:/{IMAGE_COMPONENT})*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
REGISTRY = re.compile(
    r"(?P<region>[a-z]+-[a-z]+[0-9]+)-docker\.pkg\.dev/(?P<project>[a-z][a-z0-9-]{4,28}[a-z0-9])"
    r"/(?P<repository>[a-z][a-z0-9-]{0,61}[a-z0-9])"
)
IMAGE_REF = re.compile(
    rf"{REGISTRY.pattern}/(?P<name>{IMAGE_NAME.pattern})"
    r"(?:@sha256:(?P<digest>[0-9a-f]{64})|:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))"
)

# --- Instance metadata keys -------------------------------------------------------------------------
# The run the VM agent starts (docs/run-contract.md, "A run spec"): a change of it (run id, command, a
# source's digest, settings) is a change of metadata only, which the agent sees with wait_for_change.
RUN_ATTRIBUTE = "tpu-platform-run"
ENV_ATTRIBUTE = "tpu-platform-env"  # the agent's settings (agent.env), which the start-up script writes out

# --- The environment a run gets (README, "The run contract") ----------------------------------------
CONTRACT_PREFIX = "TPU_PLATFORM_"  # the platform's: a spec's `env` may not set these
RUN_ID_ENV = "TPU_PLATFORM_RUN_ID"
DATA_ENV = "TPU_PLATFORM_DATA"
CHECKPOINT_DIR_ENV = "TPU_PLATFORM_CHECKPOINT_DIR"
MODEL_DIR_ENV = "TPU_PLATFORM_MODEL_DIR"
STATUS_DIR_ENV = "TPU_PLATFORM_STATUS_DIR"
WORKER_ID_ENV = "TPU_PLATFORM_WORKER_ID"
WORKER_COUNT_ENV = "TPU_PLATFORM_WORKER_COUNT"
COORDINATOR_ENV = "TPU_PLATFORM_COORDINATOR"
GRACE_SECONDS_ENV = "TPU_PLATFORM_GRACE_SECONDS"

# --- Exit codes (sysexits.h) ------------------------------------------------------------------------
EXIT_FINISHED = 0
EXIT_RETRY = 75  # EX_TEMPFAIL: stopped mid-run with a checkpoint; started again later, resuming from it
EXIT_CONFIG = 78  # EX_CONFIG: this run cannot work (a resume that would mix two runs); never retried
