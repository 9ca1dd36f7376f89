"""A CEL string literal (run_contract/cel.py), read back by a real CEL implementation (cel-python): whatever the
text holds, the literal is that text, in either delimiter, and never more of the expression."""

from __future__ import annotations

import re

import pytest

from run_contract.cel import LITERAL, cel_string, literal_text
from tests.iam_conditions import HOSTILE, evaluate


def value(expression: str) -> object:
    return evaluate(expression)


@pytest.mark.parametrize("quote", ["'", '"'])
@pytest.mark.parametrize("text", HOSTILE)
def test_the_literal_is_the_text_in_either_quote(text, quote):
    literal = cel_string(text, quote)
    assert literal[0] == literal[-1] == quote
    assert value(literal) == text
    assert value(f"{literal} == {cel_string(text)}")  # the same string whichever the delimiter


def test_the_agents_quote_is_the_default():
    assert cel_string("gs-prefix/") == "'gs-prefix/'"


def test_a_delimiter_cel_does_not_have_is_refused():
    with pytest.raises(ValueError, match=r"quote '`': a CEL string literal is delimited by ' or \""):
        cel_string("x", quote="`")


@pytest.mark.parametrize("quote", ["'", '"'])
@pytest.mark.parametrize("text", HOSTILE)
def test_the_platforms_reader_reads_each_literal_as_written(text, quote):
    """infra/access/model.py reads the roles of a condition back with LITERAL and literal_text: in a list, each
    literal is one match and its text, whatever it holds."""
    listed = ", ".join([cel_string(text, quote), cel_string("roles/viewer", quote)])
    assert [literal_text(found) for found in re.findall(LITERAL, listed)] == [text, "roles/viewer"]
