"""The run spec's JSON Schema (draft 2020-12), generated from run_contract.spec for the docs and editors:
`python -m run_contract.schema > docs/run-spec.schema.json` (a test fails when the committed file differs).

The schema says a spec's shape; the parser says more (a source in the stack's own bucket or registry, an
image by tag only where the stack allows it, `python` only with a folder, `completion` only for the stack).
"""

from __future__ import annotations

import json
from typing import Any

from run_contract.names import CONTRACT_PREFIX, IMAGE_NAME, MAX_RUN_ID, REQUESTER, RUN_ID, SHA256, TAG
from run_contract.spec import ENV_NAME, FOLDER_KEYS, PYTHON_VERSION, SPEC_KEYS

GS_URL = r"gs://[a-z0-9._-]+(/\S*)?"


def _whole(pattern: str) -> str:
    return f"^(?:{pattern})$"  # JSON Schema patterns match anywhere; the parser's match the whole string


def run_spec_schema() -> dict[str, Any]:
    def described(key: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": SPEC_KEYS[key], **schema}

    location = {"type": "string", "pattern": _whole(f"|{GS_URL}")}
    folder = {
        "type": "object",
        "properties": {
            "kind": {"const": "folder"},
            "uri": {"type": "string", "pattern": r"^gs://.+\.tar\.gz$"},
            "sha256": {"type": "string", "pattern": _whole(SHA256.pattern)},
        },
        "required": list(FOLDER_KEYS),
        "additionalProperties": False,
    }
    image = {
        "type": "object",
        "properties": {
            "kind": {"const": "image"},
            "image": {
                "type": "string",
                "pattern": _whole(rf".+/{IMAGE_NAME.pattern}(@sha256:[0-9a-f]{{64}}|:{TAG.pattern})"),
            },
            "allowTag": {"type": "boolean"},
        },
        "required": ["kind", "image"],
        "additionalProperties": False,
    }
    properties = {
        "runId": described("runId", {"type": "string", "maxLength": MAX_RUN_ID, "pattern": _whole(RUN_ID.pattern)}),
        "source": described("source", {"oneOf": [folder, image]}),
        "command": described("command", {"type": "array", "items": {"type": "string", "minLength": 1}}),
        "env": described(
            "env",
            {
                "type": "object",
                "propertyNames": {"pattern": _whole(ENV_NAME.pattern), "not": {"pattern": f"^{CONTRACT_PREFIX}"}},
                "additionalProperties": {"type": "string"},
            },
        ),
        "python": described("python", {"type": "string", "pattern": _whole(f"|{PYTHON_VERSION.pattern}")}),
        "requester": described("requester", {"type": "string", "pattern": _whole(REQUESTER.pattern)}),
        "data": described("data", location),
        "checkpointDir": described("checkpointDir", location),
        "modelDir": described("modelDir", location),
        "completion": described("completion", {"type": "boolean"}),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tpu-platform run spec",
        "description": "What a run is: the instance attribute tpu-platform-run, or a researcher's request.",
        "type": "object",
        "properties": properties,
        "required": ["runId", "source", "requester"],
        "additionalProperties": False,
    }


def render() -> str:
    return json.dumps(run_spec_schema(), indent=2) + "\n"


if __name__ == "__main__":
    print(render(), end="")
