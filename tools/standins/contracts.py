"""Requests and resources checked against Google's own API schemas: the discovery documents that
google-api-python-client ships (`googleapiclient/discovery_cache/documents/<api>.<version>.json`).

A request is matched to one method of the API by HTTP method and path template (`flatPath`, or a
media-upload path), then checked: every query parameter is one the method or the API declares (with
its enum), required ones are there, and the JSON body validates against the method's request schema:
no unknown field, the right types and enum values, and (for a create or update) no output-only field.
A resource (a dashboard, an alert policy, a scheduler job) is checked against its schema the same way.
"""

from __future__ import annotations

import base64
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
    upload: bool  # a media upload: the body is the object's bytes


@dataclass(frozen=True)
class Call:
    """One request as sent: what a recording stand-in or session saw."""

    method: str
    url: str  # full URL or path with query
    body: Any = None  # parsed JSON, bytes for media, or None

    def __str__(self) -> str:
        return f"{self.method} {self.url}"


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
            self.methods.append(
                Method(
                    method["id"],
                    method["httpMethod"],
                    re.compile(re.escape(base) + pattern),
                    literal,
                    method.get("parameters", {}),
                    request,
                    False,
                )
            )
            simple = method.get("mediaUpload", {}).get("protocols", {}).get("simple")
            if simple:
                pattern, literal = _template(simple["path"])
                self.methods.append(
                    Method(
                        method["id"],
                        method["httpMethod"],
                        re.compile(pattern),
                        literal,
                        method.get("parameters", {}),
                        request,
                        True,
                    )
                )
        for resource in node.get("resources", {}).values():
            self._collect(resource)

    def method(self, http_method: str, url: str) -> Method:
        """The one method that `http_method url` calls; ContractError when none does."""
        parts = urlsplit(url)
        if parts.netloc and parts.netloc != self.host and not parts.netloc.startswith("127.0.0.1"):
            raise ContractError(f"{url}: not a {self.name} URL (host {self.host})")
        candidates = [m for m in self.methods if m.http_method == http_method and m.path.fullmatch(parts.path)]
        if not candidates:
            same_path = sorted({m.http_method for m in self.methods if m.path.fullmatch(parts.path)})
            hint = f"; that path takes {', '.join(same_path)}" if same_path else ""
            raise ContractError(f"{http_method} {parts.path}: no method of {self.name} has this path{hint}")
        return max(candidates, key=lambda m: m.literal)

    def check(self, call: Call) -> Method:
        """Check one request against the API; returns the method it calls."""
        method = self.method(call.method, call.url)
        query = parse_qsl(urlsplit(call.url).query, keep_blank_values=True)
        problems: list[str] = []
        given = {key for key, _ in query}
        for key, value in query:
            spec = method.parameters.get(key) or self.doc.get("parameters", {}).get(key)
            if spec is None or spec.get("location") not in ("query", None):
                problems.append(f"query parameter {key!r} is not one of {method.id}'s")
            elif spec.get("enum") and value not in spec["enum"]:
                problems.append(f"query parameter {key}={value!r}: must be one of {', '.join(spec['enum'])}")
        for key, spec in method.parameters.items():
            if spec.get("location") == "query" and spec.get("required") and key not in given:
                problems.append(f"required query parameter {key!r} is missing")
        if method.upload:
            if dict(query).get("uploadType") != "media":
                problems.append("a simple upload needs uploadType=media")
        elif method.request is None:
            if call.body not in (None, b"", "", {}):
                problems.append(f"{method.id} takes no body, got {call.body!r}")
        else:
            body = call.body if call.body is not None else {}
            if isinstance(body, (bytes, str)):
                try:
                    body = json.loads(body or b"{}")
                except ValueError:
                    problems.append(f"{method.id} takes a JSON {method.request}, got {call.body!r}")
                    body = {}
            problems += self.problems(method.request, body, writing=True)
        if problems:
            raise ContractError(f"{call} ({method.id}): " + "; ".join(problems))
        return method

    def check_resource(self, schema: str, value: Any) -> None:
        """Check a resource we write (a dashboard, an alert policy) against `schema`."""
        if problems := self.problems(schema, value, writing=True):
            raise ContractError(f"{self.name} {schema}: " + "; ".join(problems))

    def problems(self, schema: str | dict[str, Any], value: Any, *, writing: bool, at: str = "") -> list[str]:
        spec = self.doc["schemas"][schema] if isinstance(schema, str) else schema
        if "$ref" in spec:
            return self.problems(spec["$ref"], value, writing=writing, at=at)
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
                    out += self.problems(field, item, writing=writing, at=path)
                elif extra is not None:
                    out += self.problems(extra, item, writing=writing, at=path)
                else:
                    known = ", ".join(sorted(properties or {})) or "none"
                    out.append(f"unknown field {path} (known: {known})")
            return out
        if kind == "array":
            if not isinstance(value, list):
                return [f"{where} must be a list, not {value!r}"]
            return [
                p
                for i, item in enumerate(value)
                for p in self.problems(spec["items"], item, writing=writing, at=f"{at}[{i}]")
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


@functools.cache
def api(name: str) -> Api:
    return Api(name)


def check_all(api_name: str, calls: list[Call]) -> list[str]:
    """The method ids of `calls`, each checked against `api_name`."""
    return [api(api_name).check(call).id for call in calls]


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
        call = Call(str(method).upper(), prepared.url or "", body)
        if name is None:
            self.violations.append(f"{call}: not an API this session knows")
        else:
            try:
                self.calls.append((api(name).check(call).id, call))
            except ContractError as error:
                self.violations.append(str(error))
        return super().request(str(method), url, *args, **kwargs)
