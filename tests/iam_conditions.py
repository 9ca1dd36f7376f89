"""IAM Conditions evaluated with a real CEL implementation (cel-python), as IAM evaluates them, for the
permission model's `missing(..., evaluate=allows)`: a call names its target by `resource.name`, and a
Cloud Storage listing also by the `storage.googleapis.com/objectListPrefix` API attribute."""

from __future__ import annotations

import celpy
from celpy import celtypes

from infra.access.model import Target

# Values that end a CEL literal or change what it reads (cel-spec doc/langdef.md, "String and Bytes Values"): either
# delimiter, the escape character, the line breaks a quoted literal may not hold; an injection in each quote. The
# platform quotes every value it puts in a condition (run_contract/cel.py); each builder's tests feed it these.
HOSTILE = [
    "o'brien@acme.example",
    'say "hi"',
    "back\\slash",
    "\\'",
    'a\\"',
    "line\nbreak",
    "carriage\rreturn",
    "x')||true||('",
    'x")||true||("',
    "tab\tand é",
    "",
]
HOSTILE_NAMES = [h for h in HOSTILE if h]  # those a name can be


def get_attribute(api: celtypes.MapType, key: celtypes.StringType, default: celtypes.Value) -> celtypes.Value:
    """IAM's `api.getAttribute(key, default)`."""
    return api.get(key, default)


def evaluate(expression: str, activation: dict | None = None, functions: dict | None = None) -> celtypes.Value:
    """`expression` with cel-python, `getAttribute` and any other `functions` of IAM's given."""
    env = celpy.Environment()
    program = env.program(env.compile(expression), functions={"getAttribute": get_attribute, **(functions or {})})
    return program.evaluate(activation or {})


def allows(expression: str, target: Target) -> bool:
    name, list_prefix = target
    attributes = {} if list_prefix is None else {"storage.googleapis.com/objectListPrefix": list_prefix}
    activation = {
        "resource": celtypes.MapType({celtypes.StringType("name"): celtypes.StringType(name)}),
        "api": celtypes.MapType({celtypes.StringType(k): celtypes.StringType(v) for k, v in attributes.items()}),
    }
    return bool(evaluate(expression, activation))
