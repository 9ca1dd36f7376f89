"""The platform's runner on a TPU VM: it reads the desired run, starts it under the run contract,
stops it cleanly when the desired run changes, and records each run's state.

It runs from its own virtualenv (vm_agent/environment.py): the image's Python with google-cloud-storage
and its dependencies, from the stack's wheelhouse (requirements-agent.lock). That wheelhouse serves the
catalog's `agent_pythons` (3.10 to 3.12): the plan refuses an image whose Python the catalog knows to be
another, and the start-up script one whose Python it does not know. vm_agent/environment.py, which makes
that virtualenv, runs before it exists: standard library only, and only on those Pythons (the start-up
script refuses any other first). So vm_agent is held to 3.10, their floor (vermin in
tests/test_vm_agent_sources.py, ruff's target, pyright's); run_contract, which programs import on their
image's own Python, to 3.8.
"""
