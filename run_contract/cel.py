"""CEL string literals: how a value stands inside a Common Expression Language expression, for the IAM
Conditions the program declares and the Credential Access Boundaries the agent asks STS for."""

from __future__ import annotations

QUOTES = ("'", '"')


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
