"""IAM Conditions evaluated with a real CEL implementation (cel-python), as IAM evaluates them, for the
permission model's `missing(..., evaluate=allows)`: a call names its target by `resource.name`, and a
Cloud Storage listing also by the `storage.googleapis.com/objectListPrefix` API attribute."""

from __future__ import annotations

import celpy
from celpy import celtypes

from infra.access.model import Target


def allows(expression: str, target: Target) -> bool:
    name, list_prefix = target
    attributes = {} if list_prefix is None else {"storage.googleapis.com/objectListPrefix": list_prefix}

    def get_attribute(api: celtypes.MapType, key: celtypes.StringType, default: celtypes.Value) -> celtypes.Value:
        return api.get(key, default)

    env = celpy.Environment()
    program = env.program(env.compile(expression), functions={"getAttribute": get_attribute})
    activation = {
        "resource": celtypes.MapType({celtypes.StringType("name"): celtypes.StringType(name)}),
        "api": celtypes.MapType({celtypes.StringType(k): celtypes.StringType(v) for k, v in attributes.items()}),
    }
    return bool(program.evaluate(activation))
