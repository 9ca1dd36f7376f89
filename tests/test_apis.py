"""APIs: enabled per stack, never disabled on destroy, and waited for by every resource that uses them."""

from __future__ import annotations

import pytest

from tests.support import depends_on, fixture_config, plan

# Which API each resource type needs. Kept here, independent of the program, so a component that
# forgets its dependency fails this test.
API_FOR_TYPE = {
    "gcp:storage/bucket:Bucket": "storage.googleapis.com",
    "gcp:storage/bucketIAMMember:BucketIAMMember": "storage.googleapis.com",
    "gcp:serviceaccount/account:Account": "iam.googleapis.com",
    "gcp:serviceaccount/iAMMember:IAMMember": "iam.googleapis.com",
    "gcp:projects/iAMMember:IAMMember": "cloudresourcemanager.googleapis.com",
    "gcp:billing/budget:Budget": "billingbudgets.googleapis.com",
    "gcp:monitoring/notificationChannel:NotificationChannel": "monitoring.googleapis.com",
    "gcp:pubsub/topic:Topic": "pubsub.googleapis.com",
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": "cloudkms.googleapis.com",
    "gcp:compute/network:Network": "compute.googleapis.com",
    "gcp:compute/subnetwork:Subnetwork": "compute.googleapis.com",
    "gcp:compute/router:Router": "compute.googleapis.com",
    "gcp:compute/routerNat:RouterNat": "compute.googleapis.com",
    "gcp:compute/firewall:Firewall": "compute.googleapis.com",
    "gcp:tpu/v2Vm:V2Vm": "tpu.googleapis.com",
    "gcp:projects/iAMCustomRole:IAMCustomRole": "iam.googleapis.com",
    "gcp:cloudscheduler/job:Job": "cloudscheduler.googleapis.com",
    "gcp:monitoring/alertPolicy:AlertPolicy": "monitoring.googleapis.com",
    "gcp:monitoring/dashboard:Dashboard": "monitoring.googleapis.com",
    "gcp:storage/bucketObject:BucketObject": "storage.googleapis.com",
    "gcp:cloudfunctionsv2/function:Function": "cloudfunctions.googleapis.com",
    "gcp:projects/serviceIdentity:ServiceIdentity": "eventarc.googleapis.com",
    "gcp:projects/iAMAuditConfig:IAMAuditConfig": "cloudresourcemanager.googleapis.com",
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": "run.googleapis.com",
    "gcp:artifactregistry/repository:Repository": "artifactregistry.googleapis.com",
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": "artifactregistry.googleapis.com",
}


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_every_resource_waits_for_its_api(stack):
    result = plan(fixture_config(stack), stack)
    services = {r.inputs["service"]: r.urn for r in result.of_type("gcp:projects/service:Service")}
    checked = 0
    for resource in result.resources:
        if not resource.custom or resource.type in ("gcp:projects/service:Service", "time:index/sleep:Sleep"):
            continue  # a wait for IAM changes runs in the deploy process and calls no Google API
        assert resource.type in API_FOR_TYPE, f"add {resource.type} to API_FOR_TYPE"
        api = API_FOR_TYPE[resource.type]
        assert api in services, f"{resource.name} needs {api}, which the stack does not enable"
        assert depends_on(result, resource, services[api]), f"{resource.name} does not wait for {api}"
        checked += 1
    assert checked > 10


def test_apis_stay_enabled_on_destroy():
    for service in plan(fixture_config("scheduled"), "scheduled").of_type("gcp:projects/service:Service"):
        assert service.inputs["disableOnDestroy"] is False


def test_optional_apis_follow_the_config():
    sandbox = {
        s.inputs["service"]
        for s in plan(fixture_config("scheduled"), "scheduled").of_type("gcp:projects/service:Service")
    }
    production_apis = {
        s.inputs["service"]
        for s in plan(fixture_config("production"), "production").of_type("gcp:projects/service:Service")
    }
    assert {"tpu.googleapis.com", "compute.googleapis.com", "billingbudgets.googleapis.com"} <= sandbox
    assert "pubsub.googleapis.com" not in sandbox and "pubsub.googleapis.com" in production_apis
    # The CMEK key's grant is the bootstrap's: the platform makes no Cloud KMS call.
    assert "cloudkms.googleapis.com" not in sandbox | production_apis


def test_the_image_repository_scans_images_with_the_container_scanning_api_enabled_first():
    """`enablementConfig: INHERITED` scans "dependent on API enablement" (Artifact Registry v1
    Repository.VulnerabilityScanningConfig): the repository waits for containerscanning.googleapis.com."""
    result = plan(fixture_config("scheduled"), "scheduled")
    services = {r.inputs["service"]: r.urn for r in result.of_type("gcp:projects/service:Service")}
    # The workloads' repository (the guard's functions build into their own).
    (repository,) = [
        r
        for r in result.of_type("gcp:artifactregistry/repository:Repository")
        if r.inputs["repositoryId"] == "tpu-scheduled"
    ]
    assert repository.inputs["vulnerabilityScanningConfig"] == {"enablementConfig": "INHERITED"}
    assert depends_on(result, repository, services["containerscanning.googleapis.com"])
