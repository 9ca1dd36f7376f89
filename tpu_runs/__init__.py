"""`tpu-runs`: a researcher's commands for self-service runs (submit, list, logs, fetch, stop, report).

Each call is made with the researcher's own credentials (Application Default Credentials), and only
the calls in infra/access/researcher_calls.py, which are exactly what the `researchers` setting grants.
"""
