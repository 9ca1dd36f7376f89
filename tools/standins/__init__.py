"""Loopback stand-ins of Google APIs, each request checked against Google's discovery documents: the
tests and the benchmarks share them (neither ships)."""
