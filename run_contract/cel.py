"""CEL for Cloud Storage objects: how a value stands inside a Common Expression Language expression, and the
conditions "objects under a prefix", for the IAM Conditions the program declares and the Credential Access
Boundaries the agent asks STS for (the same forms on both: the downscoping page and IAM's attribute reference).

Cloud Storage checks object calls on the object, whose name in a condition is
`projects/_/buckets/BUCKET/objects/NAME` (resource.name; IAM "Resource attributes for IAM Conditions"), and
`objects.list` on the bucket, where only the `storage.googleapis.com/objectListPrefix` API attribute narrows it
(IAM "Attribute reference for IAM Conditions": API attributes; the downscoping page's listing example)."""

from __future__ import annotations

import re

QUOTES = ("'", '"')
# One quoted literal as `cel_string` writes it: any character but its delimiter, `\\` and line breaks, or an escape.
LITERAL = r"'(?:[^'\\\r\n]|\\.)*'|\"(?:[^\"\\\r\n]|\\.)*\""
_ESCAPED = {"n": "\n", "r": "\r"}


def cel_string(text: str, quote: str = "'") -> str:
    """`text` as a CEL string literal. A prefix holds a member's key, and an address may hold `'` (o'brien@) or
    `\\`: unescaped, the first breaks the expression (STS refuses it, the run gets no token) and the second changes
    what it names. A quoted literal takes any character but its delimiter and line breaks (CR, LF) unescaped,
    and `\\` begins an escape (cel-spec doc/langdef.md, "String and Bytes Values"): those four are escaped.

    Either delimiter makes the same string; `quote` keeps the one a caller's deployed conditions already use.
    An IAM condition's expression is ForceNew in the Terraform google provider, which pulumi-gcp bridges
    (hashicorp/terraform-provider-google google/tpgiamresource/resource_iam_member.go, IamMemberBaseSchema), so
    an expression that changed only its quotes would replace the grant on the next deploy."""
    if quote not in QUOTES:
        raise ValueError(f"quote {quote!r}: a CEL string literal is delimited by ' or \"")
    escaped = text.replace("\\", "\\\\").replace(quote, f"\\{quote}").replace("\n", "\\n").replace("\r", "\\r")
    return f"{quote}{escaped}{quote}"


def literal_text(literal: str) -> str:
    """The text of one quoted literal (`LITERAL`), as `cel_string` wrote it: its escapes undone."""
    return re.sub(r"\\(.)", lambda escape: _ESCAPED.get(escape[1], escape[1]), literal[1:-1])


LIST_PREFIX = "storage.googleapis.com/objectListPrefix"  # the API attribute of an objects.list call's prefix


def object_name(bucket: str, name: str) -> str:
    """An object's (or a name prefix's) resource.name in a condition."""
    return f"projects/_/buckets/{bucket}/objects/{name}"


def named_under(bucket: str, prefix: str, quote: str = "'") -> str:
    """Object calls on names starting with `prefix`."""
    return f"resource.name.startsWith({cel_string(object_name(bucket, prefix), quote)})"


def listed_under(prefix: str, quote: str = "'") -> str:
    """Listings whose prefix starts with `prefix` (the attribute is '' for a listing without one)."""
    attribute = f"api.getAttribute({cel_string(LIST_PREFIX, quote)}, {cel_string('', quote)})"
    return f"{attribute}.startsWith({cel_string(prefix, quote)})"


def objects_under(bucket: str, prefix: str, quote: str = "'") -> str:
    """Objects under `prefix`, listing them included."""
    return f"{named_under(bucket, prefix, quote)} || {listed_under(prefix, quote)}"
