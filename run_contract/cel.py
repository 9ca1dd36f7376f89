"""CEL string literals: how a value stands inside a Common Expression Language expression, for the IAM
Conditions the program declares and the Credential Access Boundaries the agent asks STS for."""

from __future__ import annotations


def cel_string(text: str) -> str:
    """`text` as a CEL string literal. A prefix holds a member's key, and an address may hold `'` (o'brien@) or
    `\\`: unescaped, the first breaks the expression (STS refuses it, the run gets no token) and the second changes
    what it names. A quoted literal takes any character but its delimiter and line breaks (CR, LF) unescaped,
    and `\\` begins an escape (cel-spec doc/langdef.md, "String and Bytes Values"): those four are escaped."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"
