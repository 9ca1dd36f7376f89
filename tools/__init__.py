"""Developer and CI tools: run from the repository root, never imported by the runtime package."""
