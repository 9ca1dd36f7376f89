#!/usr/bin/env bash
# Records what `xpk==1.16.0 cluster create --dry-run` prints for the six slice shapes that
# tests/test_gke_xpk.py compares the GKE engine's node pools with. xpk pins kubernetes==35, so it
# lives in its own throwaway virtualenv, and its HOME and KUBECONFIG point at a temporary folder (it
# writes its settings there). It runs offline: a dry run only prints the gcloud and kubectl commands.
#
#   python3 -m venv /tmp/xpk-venv && /tmp/xpk-venv/bin/pip install xpk==1.16.0
#   XPK=/tmp/xpk-venv/bin/xpk tests/xpk/record.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
xpk="${XPK:?set XPK to the xpk executable of a virtualenv with xpk==1.16.0}"
[[ "$("$xpk" version 2>&1)" == *"xpk_version: 1.16.0"* ]] || { echo "need xpk 1.16.0" >&2; exit 1; }
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
common=(--cluster golden --project=acme-ml-gke --project-number=123456789012 --dry-run --skip-validation)
record() {  # name, then xpk's own arguments
  local name="$1"; shift
  HOME="$home" KUBECONFIG="$home/kubeconfig" "$xpk" cluster create "${common[@]}" "$@" > "$here/$name.txt" 2>&1
  echo "$name: xpk cluster create ${common[*]} $*"
}
{
  record v5e-16-spot --tpu-type=v5litepod-16 --zone=us-central1-a --spot
  record v5p-16-reservation --tpu-type=v5p-16 --zone=us-east5-a --reservation=ml-research-v5p
  record v6e-16-flex --tpu-type=v6e-16 --zone=us-central1-b --flex
  record v4-8-spot --tpu-type=v4-8 --zone=us-central2-b --spot
  record tpu7x-16-on-demand --tpu-type=tpu7x-16 --zone=us-central1-c --on-demand
  record v5e-16-two-slices --tpu-type=v5litepod-16 --zone=us-central1-a --on-demand --num-slices=2
} > "$here/COMMANDS.txt"

# A dry run prints only the `describe` of tpu7x's workload policy (a dry run pretends it exists), so the
# `create` it would run is recorded by calling xpk's own function with the describe answered "not found".
"$(dirname "$xpk")/python" - > "$here/tpu7x-16-workload-policy.txt" <<'PY'
from xpk.core import nodepool

def run(command, task, *args, **kwargs):
    print(command)
    return (1 if " describe " in command else 0), ""

nodepool.run_command_for_value = run
nodepool.ensure_resource_policy_exists("tpu7x-16-2x2x2-placement-policy", "acme-ml-gke", "us-central1-c", "2x2x2", False)
PY
echo "tpu7x-16-workload-policy: xpk.core.nodepool.ensure_resource_policy_exists('tpu7x-16-2x2x2-placement-policy', 'acme-ml-gke', 'us-central1-c', '2x2x2', False) with the describe answered 1" >> "$here/COMMANDS.txt"

# xpk's table of TPU device types (core/system_characteristics.py): the catalog's GKE shapes are checked
# against it, type by type.
"$(dirname "$xpk")/python" - > "$here/devices.json" <<'PY'
import json
from xpk.core.system_characteristics import UserFacingNameToSystemCharacteristics as table, AcceleratorType

rows = {
    name: {"gkeAccelerator": s.gke_accelerator, "topology": s.topology, "machineType": s.gce_machine_type,
           "chipsPerVm": s.chips_per_vm, "vmsPerSlice": s.vms_per_slice,
           "requiresWorkloadPolicy": s.requires_workload_policy}
    for name, s in table.items()
    if s.accelerator_type == AcceleratorType.TPU and name == s.device_type
}
print(json.dumps(rows, indent=1, sort_keys=True))
PY
echo "devices.json: xpk.core.system_characteristics.UserFacingNameToSystemCharacteristics, TPU device types" >> "$here/COMMANDS.txt"
