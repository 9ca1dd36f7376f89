"""The offline plan: the real program run in-process under Pulumi's mocks."""
