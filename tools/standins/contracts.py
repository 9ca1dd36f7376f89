"""Requests and resources checked against Google's own API schemas: the discovery documents that
google-api-python-client ships (`googleapiclient/discovery_cache/documents/<api>.<version>.json`).

A request is matched to one method of the API by HTTP method and path template (`flatPath`, or a
media-upload path), then checked: every query parameter is one the method or the API declares (with
its enum and type), required ones are there, and the JSON body validates against the method's request
schema: no unknown field, the right types and enum values, every required field there, and (for a
create or update) no output-only field. A resource (a dashboard, an alert policy, a scheduler job) is
checked against its schema the same way.

Which fields are required, as the documents say it (see `Api.required`): most APIs begin the field's
description with "Required." (the rendering of `google.api.field_behavior = REQUIRED`); a few end a
description with it (monitoring.v3's UptimeCheckConfig) or write "[Required]" (compute.v1); storage.v1
and compute.v1 list, per field, the methods that require it (`annotations.required`). An output-only
field is never required of a request, and neither is one a description requires only "for" some case.

Uploads (a method's `mediaUpload`, e.g. storage.v1 objects.insert) take `uploadType=media` (the body is
the bytes), `multipart` (a multipart/related body: the JSON metadata, checked against the request
schema, then the bytes) or `resumable` (a POST whose JSON body is the metadata, then PUTs of the bytes
to the session URI, which carries an `upload_id`); https://cloud.google.com/storage/docs/uploads-downloads.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import googleapiclient
import requests

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"


class ContractError(AssertionError):
    """A request or resource that Google's published schema does not allow."""


@functools.cache
def document(api: str) -> dict[str, Any]:
    """The discovery document of `api`, e.g. 'tpu.v2'."""
    return json.loads((DOCUMENTS / f"{api}.json").read_text())


@dataclass(frozen=True)
class Method:
    id: str  # e.g. tpu.projects.locations.nodes.stop
    http_method: str
    path: re.Pattern[str]  # over the URL path, from the host on
    literal: int  # characters of the template outside its variables: more is more specific
    parameters: dict[str, Any]
    request: str | None  # schema name of the body
    upload: bool  # a media upload path (mediaUpload.protocols): the body is the object's bytes or metadata


@dataclass(frozen=True)
class Call:
    """One request as sent: what a recording stand-in or session saw."""

    method: str
    url: str  # full URL or path with query
    body: Any = None  # parsed JSON, bytes for media or a multipart upload, or None
    content_type: str = ""  # the Content-Type header: a multipart upload's boundary is in it

    def __str__(self) -> str:
        return f"{self.method} {self.url}"


UPLOAD_TYPES = ("media", "multipart", "resumable")

# A description that makes its field required: "Required." first, a last sentence "Required."
# (monitoring.v3 TcpCheck.port, UptimeCheckConfig.timeout) or "[Required]" (compute.v1).
REQUIRED = re.compile(r"^Required\.|\[Required\]|\.\s+Required\.\s*$")


def _template(template: str) -> tuple[str, int]:
    pattern, literal, pos = "", 0, 0
    for match in re.finditer(r"\{(\+?)([^}]+)\}", template):
        text = template[pos : match.start()]
        pattern += re.escape(text)
        literal += len(text)
        pattern += ".+" if match[1] else "[^/:]+"
        pos = match.end()
    pattern += re.escape(template[pos:])
    literal += len(template) - pos
    return pattern, literal


class Api:
    """One API's methods and schemas, from its discovery document."""

    def __init__(self, name: str):
        self.name = name
        self.doc = document(name)
        root = urlsplit(self.doc["rootUrl"])
        self.host = root.netloc
        self.methods: list[Method] = []
        self._collect(self.doc)

    def _collect(self, node: dict[str, Any]) -> None:
        for method in node.get("methods", {}).values():
            pattern, literal = _template(method.get("flatPath") or method["path"])
            base = "/" + self.doc["servicePath"]
            request = (method.get("request") or {}).get("$ref")
            parameters = method.get("parameters", {})
            self.methods.append(
                Method(
                    method["id"],
                    method["httpMethod"],
                    re.compile(re.escape(base) + pattern),
                    literal,
                    parameters,
                    request,
                    False,
                )
            )
            if method.get("useMediaDownloadService"):
                # Its media (alt=media) is served under /download/ too, where Google's own client library
                # reads it (google-cloud-storage blob.py _DOWNLOAD_URL_TEMPLATE,
                # "{hostname}/download/storage/{api_version}{path}?alt=media").
                self.methods.append(
                    Method(
                        method["id"],
                        method["httpMethod"],
                        re.compile(re.escape("/download" + base) + pattern),
                        literal,
                        parameters,
                        request,
                        False,
                    )
                )
            for protocol in method.get("mediaUpload", {}).get("protocols", {}).values():
                pattern, literal = _template(protocol["path"])
                compiled = re.compile(pattern)
                self.methods.append(
                    Method(method["id"], method["httpMethod"], compiled, literal, parameters, request, True)
                )
        for resource in node.get("resources", {}).values():
            self._collect(resource)

    def method(self, http_method: str, url: str) -> Method:
        """The one method that `http_method url` calls; ContractError when none does."""
        parts = urlsplit(url)
        if parts.netloc and parts.netloc != self.host and not parts.netloc.startswith("127.0.0.1"):
            raise ContractError(f"{url}: not a {self.name} URL (host {self.host})")
        candidates = [m for m in self.methods if m.http_method == http_method and m.path.fullmatch(parts.path)]
        if not candidates and http_method == "PUT" and "upload_id" in dict(parse_qsl(parts.query)):
            # A resumable upload's bytes: PUT to the session URI, the upload path with an upload_id
            # (https://cloud.google.com/storage/docs/performing-resumable-uploads).
            candidates = [m for m in self.methods if m.upload and m.path.fullmatch(parts.path)]
        if not candidates:
            same_path = sorted({m.http_method for m in self.methods if m.path.fullmatch(parts.path)})
            hint = f"; that path takes {', '.join(same_path)}" if same_path else ""
            raise ContractError(f"{http_method} {parts.path}: no method of {self.name} has this path{hint}")
        return max(candidates, key=lambda m: m.literal)

    def check(self, call: Call) -> Method:
        """Check one request against the API; returns the method it calls."""
        method = self.method(call.method, call.url)
        query = parse_qsl(urlsplit(call.url).query, keep_blank_values=True)
        params = dict(query)
        problems: list[str] = []
        for key, value in query:
            spec = method.parameters.get(key) or self.doc.get("parameters", {}).get(key)
            if key == "upload_id" and method.upload and params.get("uploadType") == "resumable":
                continue  # the session's id, in the session URI the first request of a resumable upload returns
            if spec is None or spec.get("location") not in ("query", None):
                problems.append(f"query parameter {key!r} is not one of {method.id}'s")
            elif spec.get("enum") and value not in spec["enum"]:
                problems.append(f"query parameter {key}={value!r}: must be one of {', '.join(spec['enum'])}")
            elif spec.get("type") == "boolean" and value not in ("true", "false"):
                problems.append(f"query parameter {key}={value!r}: must be true or false")
            elif spec.get("type") == "integer" and not re.fullmatch(r"-?\d+", value):
                problems.append(f"query parameter {key}={value!r}: must be an integer")
        for key, spec in method.parameters.items():
            if spec.get("location") == "query" and spec.get("required") and key not in params:
                problems.append(f"required query parameter {key!r} is missing")
        if method.upload:
            problems += self._upload_problems(method, call, params)
        elif method.request is None:
            if call.body not in (None, b"", "", {}):
                problems.append(f"{method.id} takes no body, got {call.body!r}")
        else:
            body = self._json(method, call.body, problems)
            if method.id == "logging.entries.write" and isinstance(body, dict):
                body = _with_entry_defaults(body)
            mask = set(params["updateMask"].split(",")) if "updateMask" in params else None
            problems += self.problems(method.request, body, writing=True, method=method.id, mask=mask)
        if problems:
            raise ContractError(f"{call} ({method.id}): " + "; ".join(problems))
        return method

    def _json(self, method: Method, body: Any, problems: list[str]) -> Any:
        """A request's JSON body, parsed when it came as bytes; an empty body is an empty object."""
        if body is None:
            return {}
        if isinstance(body, (bytes, str)):
            try:
                return json.loads(body or b"{}")
            except ValueError:
                problems.append(f"{method.id} takes a JSON {method.request}, got {body!r}")
                return {}
        return body

    def _upload_problems(self, method: Method, call: Call, params: dict[str, str]) -> list[str]:
        kind = params.get("uploadType")
        if kind not in UPLOAD_TYPES:
            return [f"uploadType={kind!r}: an upload takes uploadType {', '.join(UPLOAD_TYPES)}"]
        if "upload_id" in params:
            return [] if kind == "resumable" else [f"an upload_id belongs to a resumable upload, not {kind}"]
        problems: list[str] = []
        metadata: Any = {}
        if kind == "multipart":
            metadata = self._multipart_metadata(call, problems)
        elif kind == "resumable":
            metadata = self._json(method, call.body, problems)
        if method.request is not None and kind != "media":
            problems += self.problems(method.request, metadata, writing=True, method=method.id)
        # storage.v1 objects.insert's `name`: "Required when the object metadata is not otherwise provided."
        name = method.parameters.get("name", {})
        named = "name" in params or (isinstance(metadata, dict) and metadata.get("name"))
        if "Required when" in name.get("description", "") and not named:
            problems.append("the object has no name: neither the name parameter nor the metadata gives one")
        return problems

    def _multipart_metadata(self, call: Call, problems: list[str]) -> Any:
        """The JSON metadata of a multipart upload: a multipart/related body of two parts, the metadata
        (application/json) and the bytes (https://cloud.google.com/storage/docs/uploading-objects,
        "multipart upload")."""
        if not call.content_type.startswith("multipart/related") or "boundary=" not in call.content_type:
            problems.append(f"a multipart upload is multipart/related with a boundary, not {call.content_type!r}")
            return {}
        raw = call.body if isinstance(call.body, bytes) else str(call.body or "").encode()
        head = f"Content-Type: {call.content_type}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
        parts = list(message.iter_parts()) if message.is_multipart() else []
        if len(parts) != 2:
            problems.append(f"a multipart upload has two parts, metadata and media; this one has {len(parts)}")
            return {}
        if parts[0].get_content_type() != "application/json":
            problems.append(f"a multipart upload's first part is its JSON metadata, not {parts[0].get_content_type()}")
            return {}
        payload = parts[0].get_payload(decode=True)
        try:
            return json.loads(payload if isinstance(payload, bytes) and payload else b"{}")
        except ValueError:
            problems.append("a multipart upload's metadata is not JSON")
            return {}

    def check_resource(self, schema: str, value: Any) -> None:
        """Check a resource we write (a dashboard, an alert policy) against `schema`."""
        if problems := self.problems(schema, value, writing=True):
            raise ContractError(f"{self.name} {schema}: " + "; ".join(problems))

    @staticmethod
    def required(field: dict[str, Any], method: str | None) -> bool:
        """Whether a request to `method` must set `field` (see the module's docstring)."""
        if field.get("readOnly"):
            return False
        if method is not None and method in field.get("annotations", {}).get("required", ()):
            return True
        return bool(REQUIRED.search(field.get("description", "")))

    def problems(
        self,
        schema: str | dict[str, Any],
        value: Any,
        *,
        writing: bool,
        at: str = "",
        method: str | None = None,
        mask: set[str] | None = None,
    ) -> list[str]:
        """What is wrong with `value` as a `schema`; `writing`: as a request sends it (to `method`),
        where output-only fields are refused and required ones must be there (of the top level, only
        those in `mask`, a partial update's updateMask)."""
        spec = self.doc["schemas"][schema] if isinstance(schema, str) else schema
        if "$ref" in spec:
            return self.problems(spec["$ref"], value, writing=writing, at=at, method=method, mask=mask)
        where = at or "body"
        kind = spec.get("type")
        if kind == "object":
            if not isinstance(value, dict):
                return [f"{where} must be an object, not {value!r}"]
            out: list[str] = []
            properties = spec.get("properties")
            extra = spec.get("additionalProperties")
            for key, item in value.items():
                path = f"{at}.{key}" if at else key
                if properties and key in properties:
                    field = properties[key]
                    if writing and field.get("readOnly"):
                        out.append(f"{path} is output only")
                    out += self.problems(field, item, writing=writing, at=path, method=method)
                elif extra is not None:
                    out += self.problems(extra, item, writing=writing, at=path, method=method)
                else:
                    known = ", ".join(sorted(properties or {})) or "none"
                    out.append(f"unknown field {path} (known: {known})")
            for key, field in (properties or {}).items() if writing else ():
                if key not in value and (mask is None or key in mask) and self.required(field, method):
                    out.append(f"required field {f'{at}.{key}' if at else key} is missing")
            return out
        if kind == "array":
            if not isinstance(value, list):
                return [f"{where} must be a list, not {value!r}"]
            return [
                p
                for i, item in enumerate(value)
                for p in self.problems(spec["items"], item, writing=writing, at=f"{at}[{i}]", method=method)
            ]
        if kind == "string":
            if spec.get("format") in ("int64", "uint64") and isinstance(value, int) and not isinstance(value, bool):
                return []
            if not isinstance(value, str):
                return [f"{where} must be a string, not {value!r}"]
            if spec.get("enum") and value not in spec["enum"]:
                return [f"{where} = {value!r}: must be one of {', '.join(spec['enum'])}"]
            if spec.get("format") == "google-duration" and not re.fullmatch(r"-?\d+(\.\d+)?s", value):
                return [f"{where} = {value!r}: a duration like '60s'"]
            if spec.get("format") == "byte":
                try:
                    base64.b64decode(value, validate=True)
                except ValueError:
                    return [f"{where} = {value!r}: must be base64"]
            return []
        if kind == "integer":
            ok = isinstance(value, int) and not isinstance(value, bool)
            return [] if ok else [f"{where} must be an integer, not {value!r}"]
        if kind == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return [] if ok else [f"{where} must be a number, not {value!r}"]
        if kind == "boolean":
            return [] if isinstance(value, bool) else [f"{where} must be true or false, not {value!r}"]
        return []  # "any"

    def writable_fields(self, schema: str) -> set[str]:
        """The fields of `schema` a request may set: all but those the document marks output only."""
        properties = self.doc["schemas"][schema]["properties"]
        return {name for name, field in properties.items() if not field.get("readOnly")}


def _with_entry_defaults(body: dict[str, Any]) -> dict[str, Any]:
    """entries.write's body with each entry's logName and resource filled from the request's: the
    request's are "a default ... assigned to all log entries in entries that do not specify a value"
    (logging.v2 WriteLogEntriesRequest.logName, .resource), so an entry may leave them out."""
    defaults = {key: body[key] for key in ("logName", "resource") if key in body}
    entries = body.get("entries")
    if not defaults or not isinstance(entries, list):
        return body
    return {**body, "entries": [{**defaults, **e} if isinstance(e, dict) else e for e in entries]}


@functools.cache
def api(name: str) -> Api:
    return Api(name)


def check_all(api_name: str, calls: list[Call]) -> list[str]:
    """The method ids of `calls`, each checked against `api_name`."""
    return [api(api_name).check(call).id for call in calls]


def _content_type(headers: Any) -> str:
    return next((str(v) for k, v in dict(headers or {}).items() if str(k).lower() == "content-type"), "")


class CheckedSession(requests.Session):
    """A requests session that checks every request it sends against the API it is addressed to
    (by path: /v2/ and /v2alpha1/ are the TPU API, /storage/v1/ and /upload/storage/v1/ Cloud Storage), and
    keeps the calls and any violations. Handed to code under test in place of its authorized session."""

    ROUTES = (
        ("/upload/storage/v1/", "storage.v1"),
        ("/storage/v1/", "storage.v1"),
        ("/v2/", "tpu.v2"),
        ("/v2alpha1/", "tpu.v2alpha1"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Call]] = []  # (method id, call)
        self.violations: list[str] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        prepared = requests.Request(
            str(method), str(url), params=kwargs.get("params"), data=kwargs.get("data"), json=kwargs.get("json")
        ).prepare()
        body: Any = kwargs.get("json")
        if body is None and kwargs.get("data") is not None:
            body = kwargs["data"]
        path = urlsplit(prepared.url or "").path
        name = next((api_name for prefix, api_name in self.ROUTES if path.startswith(prefix)), None)
        call = Call(str(method).upper(), prepared.url or "", body, _content_type(kwargs.get("headers")))
        if name is None:
            self.violations.append(f"{call}: not an API this session knows")
        else:
            try:
                self.calls.append((api(name).check(call).id, call))
            except ContractError as error:
                self.violations.append(str(error))
        return super().request(str(method), url, *args, **kwargs)
