"""Goodput and cost: where a run's billed time went, what it cost, and the checkpoint interval that wastes least.

The record of one run's time by category, and the agent's events it is measured from, are the run
contract's (run_contract/timeline.py); this package keeps the model around them:
- `pricing`: a timeline in chip-hours and list-price USD, priced by infra/cost.py.
- `whatif`: before launch, the expected time and cost of a job and its best checkpoint interval.

docs/goodput.md has the formulas, when each applies, and their sources.
"""
