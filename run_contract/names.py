"""The run contract's names: patterns for ids and image references, the instance metadata keys, the
environment a run gets, and its exit codes."""

from __future__ import annotations

import re
from typing import Callable, Mapping, NamedTuple

# --- Ids --------------------------------------------------------------------------------------------
# A stack run's id: segments of letters, digits, `.`, `_`, `-`, joined by `/` (`<stack>/<workload>/<vm>/<run>`).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
MAX_RUN_ID = 200
# A researcher's run id, stricter: one path part of the run's model and checkpoint prefixes and a log label;
# `tpu-runs` takes it from a flag and the agent from the request. Their run is `<member key>/<id>`.
REQUEST_RUN_ID = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?")
REQUEST_RUN_ID_RULE = "1-32 lowercase letters, digits and '-', starting with a letter"
# A researcher's address, in the characters the platform names its folders in: the member's folders are
# `user-ADDRESS` (run_contract/paths.py member_key), which grants take as prefixes in these characters
# (infra/grants.py objects_in_any). A condition quotes them as a CEL literal all the same (run_contract/cel.py).
MEMBER_ADDRESS = r"[A-Za-z0-9._+-]+@[A-Za-z0-9.-]+\.[a-z]{2,}"
MEMBER_ADDRESS_RULE = "the address in letters, digits, '.', '_', '+' and '-'"
RESEARCHER = re.compile(rf"(user|group):{MEMBER_ADDRESS}")
# Who asks: "stack" for the stack's own run; a researcher (user:) or their group (group:) for a request, in the
# researcher's one pattern: a request's requester must be the member whose folder holds it (run_contract/request.py).
REQUESTER = re.compile(rf"stack|{RESEARCHER.pattern}")
REQUESTER_RULE = f'"stack", "user:<email>" or "group:<email>", {MEMBER_ADDRESS_RULE}'
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

# --- A worker's place in its slice, on either engine -------------------------------------------------
# On a VM the start-up script writes TPU_PLATFORM_WORKER_ID/_COUNT/_COORDINATOR from the metadata server
# (`agent-worker-number`, `worker-network-endpoints`). In a GKE pod, GKE injects TPU_WORKER_ID and
# TPU_WORKER_HOSTNAMES (worker 0 first) into an Indexed Job asking for google.com/tpu (gke-tpu reference,
# "The JobSet"); JAX's own GKE detection reads them the same way, coordinator = the first host at 8482
# (jax/_src/clusters/cloud_tpu_cluster.py, GkeTpuCluster, jax 0.10.2).
GKE_WORKER_ID_ENV = "TPU_WORKER_ID"
GKE_WORKER_HOSTNAMES_ENV = "TPU_WORKER_HOSTNAMES"
# Where worker 0 serves JAX's distributed runtime: the port JAX picks itself on a Cloud TPU slice
# (`coordinator_port = '8482'`, ibid.); TPU_PLATFORM_COORDINATOR_PORT moves it (a sandbox of many slices).
COORDINATOR_PORT = 8482
COORDINATOR_PORT_ENV = "TPU_PLATFORM_COORDINATOR_PORT"
# A multislice run on GKE: each pod's JobSet says how many slices there are, which one is the pod's, and where
# slice 0's worker 0 is (infra/gke/jobsets.py multislice_env); JAX's TPU cluster detection reads these four
# (jax/_src/clusters/cloud_tpu_cluster.py, BaseTpuCluster, jax 0.10.2): its world is every slice's workers,
# worker `slice id * workers per slice + TPU_WORKER_ID`, meeting at the coordinator's host (its port dropped)
# on 8482. MEGASCALE_PORT is the port of libtpu's own cross-slice (DCN) service on that host.
MEGASCALE_COORDINATOR_ENV = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES_ENV = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID_ENV = "MEGASCALE_SLICE_ID"
MEGASCALE_PORT_ENV = "MEGASCALE_PORT"


_HOST = r"[A-Za-z0-9.-]+"


class WorkerPlace(NamedTuple):
    worker_id: int
    worker_count: int
    coordinator: str  # `host:port` of worker 0; "" on one host


def worker_place(environ: Mapping[str, str]) -> WorkerPlace:
    """This worker's place in its slice: the platform's variables where the VM engine set them, else what
    GKE injects, else one host. ValueError names the variable and the value that do not make a place."""

    def number(name: str, default: int, high: int = 4096) -> int:
        value = environ.get(name, "")
        if not value:
            return default
        if not re.fullmatch(r"[0-9]{1,5}", value) or int(value) > high:
            raise ValueError(f"{name}={value!r}: a number from 0 to {high}")
        return int(value)

    if environ.get(WORKER_COUNT_ENV) or environ.get(WORKER_ID_ENV):
        worker, count = number(WORKER_ID_ENV, 0), number(WORKER_COUNT_ENV, 1)
        coordinator = environ.get(COORDINATOR_ENV, "")
        named = WORKER_ID_ENV
    elif environ.get(GKE_WORKER_HOSTNAMES_ENV) or environ.get(MEGASCALE_NUM_SLICES_ENV):
        return _gke_place(environ, number)
    else:
        return WorkerPlace(0, 1, "")
    if count < 1 or worker >= count:
        raise ValueError(f"{named}={worker} is not a worker of {count}")
    return WorkerPlace(worker, count, coordinator)


def _gke_place(environ: Mapping[str, str], number: Callable[..., int]) -> WorkerPlace:
    """A pod's place from what GKE injects (its slice's hosts, its index there) and, in a multislice run, what
    its JobSet says (the slices, its own, where the coordinator is): as JAX's GkeTpuCluster reads them."""
    listed = environ.get(GKE_WORKER_HOSTNAMES_ENV, "")
    hosts = listed.split(",") if listed else []
    if not all(re.fullmatch(_HOST, host) for host in hosts):
        raise ValueError(f"{GKE_WORKER_HOSTNAMES_ENV}={listed!r}: host names, comma-separated")
    per_slice = len(hosts) or 1  # a single-host slice's pod gets no host list
    in_slice = number(GKE_WORKER_ID_ENV, 0)
    if in_slice >= per_slice:
        raise ValueError(f"{GKE_WORKER_ID_ENV}={in_slice} is not a worker of {per_slice}")
    slices, slice_id = number(MEGASCALE_NUM_SLICES_ENV, 1), number(MEGASCALE_SLICE_ID_ENV, 0)
    if slices < 1 or slice_id >= slices:
        raise ValueError(f"{MEGASCALE_SLICE_ID_ENV}={slice_id} is not a slice of {slices}")
    address = environ.get(MEGASCALE_COORDINATOR_ENV, "")
    host = address.rsplit(":", 1)[0] if re.fullmatch(rf"{_HOST}(:[0-9]{{1,5}})?", address) else ""
    if address and not host:
        raise ValueError(f"{MEGASCALE_COORDINATOR_ENV}={address!r}: a host name, with a port or not")
    if slices > 1 and not host:
        raise ValueError(f"{MEGASCALE_NUM_SLICES_ENV}={slices} without {MEGASCALE_COORDINATOR_ENV}: no slice 0 to meet")
    count = per_slice * slices
    port = number(COORDINATOR_PORT_ENV, COORDINATOR_PORT, 65535)
    coordinator = f"{host or hosts[0]}:{port}" if count > 1 else ""
    return WorkerPlace(slice_id * per_slice + in_slice, count, coordinator)


# --- Exit codes (sysexits.h) ------------------------------------------------------------------------
EXIT_FINISHED = 0
EXIT_RETRY = 75  # EX_TEMPFAIL: stopped mid-run with a checkpoint; started again later, resuming from it
EXIT_CHECKPOINT_FAILED = 74  # EX_IOERR: a checkpoint could not be written; failed, retried from the last committed one
EXIT_CONFIG = 78  # EX_CONFIG: this run cannot work (a resume that would mix two runs); never retried
