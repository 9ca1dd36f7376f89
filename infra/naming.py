"""GCP naming rules, as predicates that return why a name is refused (or None when it is fine).

Each rule is the documented one, so a name refused here is one GCP would refuse at `pulumi up`,
not an invented house style.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from run_contract import paths

# Whole-string matches (`fullmatch`): `match` with `$` would accept a trailing newline.
# https://cloud.google.com/storage/docs/buckets#naming (names without dots)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")
# https://cloud.google.com/iam/docs/service-accounts-create#creating: 6-30 chars
_SERVICE_ACCOUNT_ID = re.compile(r"[a-z](?:[-a-z0-9]{4,28}[a-z0-9])")
# RFC 1035 names, as Compute Engine and Cloud TPU node ids use them.
_RFC1035 = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def _label_letter(char: str) -> bool:
    """A lowercase letter, international ones included (Unicode category Ll)."""
    return unicodedata.category(char) == "Ll"


def _label_char(char: str) -> bool:
    return _label_letter(char) or char in "0123456789_-"


def bucket_name_problem(name: str) -> str | None:
    if not _BUCKET.fullmatch(name):
        return "3-63 characters of lowercase letters, digits, '-' and '_', starting and ending with a letter or digit"
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return "must not start with 'goog' or contain 'google'"
    return None


def service_account_id_problem(account_id: str) -> str | None:
    if not _SERVICE_ACCOUNT_ID.fullmatch(account_id):
        return "6-30 characters of lowercase letters, digits and '-', starting with a letter and not ending with '-'"
    return None


# https://cloud.google.com/compute/docs/labeling-resources#requirements: keys and values of lowercase
# letters, numeric characters, underscores and dashes, "international characters are allowed"; keys
# 1-63 characters starting with a lowercase letter or international character, values at most 63.
def label_key_problem(key: str) -> str | None:
    if not (1 <= len(key) <= 63 and _label_letter(key[0]) and all(_label_char(c) for c in key)):
        return "1-63 lowercase letters (international ones too), digits, '_' or '-', starting with a letter"
    return None


def label_value_problem(value: str) -> str | None:
    if not (len(value) <= 63 and all(_label_char(c) for c in value)):
        return "at most 63 lowercase letters (international ones too), digits, '_' or '-'"
    return None


def resource_id_problem(name: str, max_length: int = 63) -> str | None:
    """RFC 1035 ids (TPU nodes, networks, firewalls, routers)."""
    if len(name) > max_length or not _RFC1035.fullmatch(name):
        return f"1-{max_length} lowercase letters, digits and '-', starting with a letter and not ending with '-'"
    return None


# Kubernetes object names (kubernetes.io/docs/concepts/overview/working-with-objects/names): most kinds
# take a DNS-1123 subdomain (at most 253), namespaces and a few others a DNS-1123 label (at most 63).
_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
# Label keys and values (kubernetes.io/docs/concepts/overview/working-with-objects/labels, "Syntax and
# character set"): an optional DNS subdomain prefix and '/', then a name of at most 63 alphanumerics,
# '-', '_', '.', alphanumeric at both ends; a value is empty or such a name.
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


def dns1123_label_problem(name: str) -> str | None:
    if len(name) > 63 or not _DNS1123_LABEL.fullmatch(name):
        return "1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    return None


def dns1123_subdomain_problem(name: str) -> str | None:
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        return "at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    return None


def kubernetes_label_problem(key: str, value: str) -> str | None:
    """Why a Kubernetes label `key: value` is refused (None when the API server accepts it)."""
    prefix, _, name = key.rpartition("/")
    if (prefix and dns1123_subdomain_problem(prefix)) or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        return "a key of an optional DNS subdomain and '/', then 1-63 letters, digits, '-', '_' or '.'"
    if len(value) > 63 or (value and not _QUALIFIED_NAME.fullmatch(value)):
        return "a value of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


# --- Every physical name the platform derives, in one place -------------------------------------------
# Terms: a *stack* is one Pulumi stack (dev, prod); the platform calls the GCP project and everything in
# it that the stack owns the stack's *environment*. Names carry the stack so two stacks never collide.

MAX_STACK = 12  # the config reader's limit, so every name below fits at the longest inputs
# A stack's name ends names derived from it (tpu-deployer-<stack>, a workload's tpu-<workload>-<stack>), which
# may not end in '-'; custom role ids drop its '-' (custom_role_id), so `a--b` would take `a-b`'s roles.
_STACK = re.compile(rf"[a-z](?:[a-z0-9]|-(?=[a-z0-9])){{0,{MAX_STACK - 1}}}")


def stack_problem(stack: str) -> str | None:
    """Why `stack` cannot name a stack: the program's and the bootstrap's one rule."""
    if not _STACK.fullmatch(stack):
        return f"1-{MAX_STACK} lowercase letters, digits and single '-' between them, starting with a letter"
    if TEAM_PART in stack.split("-")[1:]:
        # A team's log bucket is `tpu-<stack>-team-<team>` and a team may be named `x-team-a`: stack `dev-team-x`'s
        # team `a` would be stack `dev`'s team `x-team-a`, and `dev`'s deployer, whose log role admits its stack's
        # names by their start (platform_log_prefixes), could edit it. With no `team` part after the first, the
        # first `-team-` of such a name ends the stack.
        return f"no '-'-separated part after the first may be '{TEAM_PART}' (it would read as a team's log bucket)"
    return None


PLATFORM_ACCOUNT_KINDS = ("scheduler", "guard", "guard-invoker", "guard-build", "gke-nodes")
GUARD_FUNCTIONS = ("budget-guard", "recovery", "complete", "scheduled-start")


def bucket(prefix: str, stack: str, purpose: str) -> str:
    """`<prefix>-<stack>-<purpose>`: data, checkpoints, models, status, functions, artifacts."""
    return f"{prefix}-{stack}-{purpose}"


# docs/run-contract.md: workload sources (and the agent) live in the stack's artifacts bucket, not the
# data bucket, as `sources/<sha256>.tar.gz`; a run request lives under its VM's status folder. The object
# paths inside the buckets are the run contract's (run_contract/paths.py), which every runtime imports.
ARTIFACTS = "artifacts"


def job_tag(stack: str, vm: str) -> str:
    """The network tag of one TPU VM's hosts and slices, and the name of the firewall rule that lets them reach
    each other (infra/network.py): RFC 1035, at most 63 characters; a digest of the VM's name when it is long."""
    tag = f"tpu-{stack}-job-{vm}"
    if resource_id_problem(tag) is None:
        return tag
    return f"tpu-{stack}-job-{hashlib.sha256(vm.encode()).hexdigest()[:16]}"


def self_service_account_id(vm: str, stack: str) -> str:
    """A self-service VM's own account: it shares no account with a VM that runs reviewed work. The VM's
    name when it fits IAM's 30 characters, else a digest of it."""
    account = f"tpu-ss-{vm}-{stack}"
    if service_account_id_problem(account) is None:
        return account
    return f"tpu-ss-{hashlib.sha256(vm.encode()).hexdigest()[:10]}-{stack}"


LOG_BUCKET = "_Default"  # every project's own log bucket, where the agent's entries land


def researcher_log_view(project: str, member: str) -> str:
    """The full name of `member`'s log view, which shows only `researcher_log(member)`: what `tpu-runs logs`
    reads and what the researcher's viewAccessor grant is conditioned on."""
    return f"projects/{project}/locations/global/buckets/{LOG_BUCKET}/views/{paths.researcher_log(member)}"


def workload_account_id(workload: str, stack: str) -> str:
    return f"tpu-{workload}-{stack}"


def platform_account_id(kind: str, stack: str) -> str:
    """The platform's own accounts; a workload may not take one of these names (config rules)."""
    if kind not in PLATFORM_ACCOUNT_KINDS:
        raise ValueError(f"unknown platform account {kind!r}")
    return f"tpu-{kind}-{stack}"


def deployer_account_id(stack: str) -> str:
    """The bootstrap's per-environment deployer (in the admin project)."""
    return f"tpu-deployer-{stack}"


def custom_role_id(kind: str, stack: str) -> str:
    """`tpuPlatform<Kind><Stack>`: custom role ids allow letters, digits, '_' and '.' only."""
    return "tpuPlatform" + "".join(part.capitalize() for part in (*kind.split("-"), *stack.split("-")))


def function_name(kind: str, stack: str) -> str:
    if kind not in GUARD_FUNCTIONS:
        raise ValueError(f"unknown guard function {kind!r}")
    return f"tpu-{kind}-{stack}"


def scheduler_job(vm: str, action: str) -> str:
    return f"tpu-{vm}-{action}"


def node_path(project: str, zone: str, vm: str) -> str:
    """The TPU API's name of a node: `projects/P/locations/ZONE/nodes/NAME`."""
    return f"projects/{project}/locations/{zone}/nodes/{vm}"


def node_ids(vm: str, slices: int = 1) -> list[str]:
    """The TPU nodes of a VM: `<vm>`, or a multislice's `<vm>-0` … `<vm>-<n-1>` (tpu.v2.json
    MultisliceParams.nodeIdPrefix: "np" -> np-0, np-1, …; the platform's prefix is the VM's name)."""
    return [f"{vm}-{i}" for i in range(slices)] if slices > 1 else [vm]


def artifact_repository(stack: str) -> str:
    """The stack's Artifact Registry Docker repository id: lowercase letters, digits and '-', starting
    with a letter, at most 63 (Artifact Registry, "Create standard repositories")."""
    return f"tpu-{stack}"


def function_repository(stack: str) -> str:
    """The Artifact Registry repository the guard's functions are built into (its build account writes
    there and nowhere else), apart from the workloads' (whose tags are immutable)."""
    return f"tpu-functions-{stack}"


# --- The GKE engine (infra/gke/) --------------------------------------------------------------------
# A cluster's name is at most 40 characters (GKE: "The name must be 1-40 characters"); GKE builds its nodes' names
# from the cluster's and the pool's with a hash, within a 63-character host name, so pool names are kept
# short (the config reader's limit, MAX_SLICE_POOL) and end in the slice's index.
MAX_SLICE_POOL = 24  # a slice pool's name in the stack file
MAX_SLICES = 64  # slices of one pool: node pools <pool>-0 … <pool>-63


def gke_cluster(stack: str) -> str:
    """The stack's GKE cluster, in its region."""
    return f"tpu-{stack}"


def gke_subnet(stack: str) -> str:
    """The cluster's subnet (nodes; pods and services as its secondary ranges), router and NAT."""
    return f"tpu-{stack}-gke"


GKE_POD_RANGE = "pods"  # the subnet's secondary range names the cluster's IP allocation policy reads
GKE_SERVICE_RANGE = "services"
GKE_SYSTEM_POOL = "system"


def slice_node_pool(pool: str, index: int) -> str:
    """One slice of a slice pool is one GKE node pool: `<pool>-<index>`, as xpk names `<cluster>-np-<i>`."""
    if not 0 <= index < MAX_SLICES:
        raise ValueError(f"slice index {index} outside 0..{MAX_SLICES - 1}")
    return f"{pool}-{index}"


def workload_policy(stack: str, pool: str) -> str:
    """A TPU7x slice pool's HIGH_THROUGHPUT workload policy (a regional compute ResourcePolicy): one per
    pool, shared by its slices, so replacing one pool never touches another of the same shape."""
    return f"tpu-{stack}-{pool}-slice"


# --- Teams on the GKE engine (infra/gke/queues.py, infra/gke/teams.py) -----------------------------------
# Namespaces a team may not take: Kubernetes' own ("Namespaces": default, kube-system, kube-public,
# kube-node-lease; names starting kube- are reserved), GKE's (gke-*, gmp-*), and the controllers' the admin
# phase installs (JobSet's and Kueue's release manifests run in these two).
SYSTEM_NAMESPACES = ("default", "jobset-system", "kueue-system")
SYSTEM_NAMESPACE_PREFIXES = ("kube-", "gke-", "gmp-")
TEAM_SERVICE_ACCOUNT = "tpu-workloads"  # the Kubernetes service account a team's jobs run as, in its namespace


def team_namespace(team: str) -> str:
    """A team's namespace when the stack names none."""
    return f"team-{team}"


def team_prefix(team: str) -> str:
    """A team's objects in the checkpoints and models buckets: apart from every workload's `<workload>/`."""
    return f"teams/{team}/"


def team_sources_prefix(team: str) -> str:
    """A team's folder sources in the artifacts bucket (`tpu-runs submit --team --folder`), apart from `sources/`,
    which the self-service VMs' accounts read whole."""
    return f"{team_prefix(team)}{paths.SOURCES_PREFIX}"


# A team's run output (infra/gke/team_access.py): a log bucket of its own, which a sink fills with its namespace's
# container logs, and one view on it that its members read. A log view's filter cannot select a namespace
# (logging.v2 LogView.filter: SOURCE(), resource.type and LOG_ID() only), so the bucket itself is the team's.
# Bucket and sink ids: at most 100 letters, digits, '_', '-' and '.' (logging.v2 buckets.create bucketId,
# LogSink.name); `tpu-<stack>-team-<team>` is at most 52.
TEAM_LOG_VIEW = "runs"
TEAM_LOG_LOCATION = "global"


TEAM_PART = "team"


def team_log_bucket(stack: str, team: str) -> str:
    """The id of a team's log bucket, and of the sink that fills it."""
    return f"tpu-{stack}-{TEAM_PART}-{team}"


def team_log_bucket_path(project: str, stack: str, team: str) -> str:
    return f"projects/{project}/locations/{TEAM_LOG_LOCATION}/buckets/{team_log_bucket(stack, team)}"


# How every `paths.researcher_log` id starts (a test compares them; the run contract ships byte for byte).
RESEARCHER_LOG_PREFIX = "tpu-runs-"


def platform_log_prefixes(project: str, stack: str) -> tuple[str, str]:
    """The starts of the full names of the stack's log buckets and views: the teams' buckets (and their views)
    and the researchers' views of `_Default`. The deployer edits no other (infra/access/environment.py).
    The first is the stack's alone (stack_problem: no other stack's team bucket starts so). The second names no
    stack: a researcher's view is named by the member (`paths.researcher_log`), one per project, so stacks that
    share a project share it, and each one's deployer may edit the others' researchers' views
    (docs/ci-and-bootstrap.md)."""
    return (
        f"projects/{project}/locations/{TEAM_LOG_LOCATION}/buckets/{team_log_bucket(stack, '')}",
        f"projects/{project}/locations/global/buckets/{LOG_BUCKET}/views/{RESEARCHER_LOG_PREFIX}",
    )


def team_log_view(project: str, stack: str, team: str) -> str:
    """The full name of a team's log view: what `tpu-runs logs --team` reads and its members' viewAccessor grant
    is conditioned on."""
    return f"{team_log_bucket_path(project, stack, team)}/views/{TEAM_LOG_VIEW}"
