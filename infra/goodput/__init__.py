"""Goodput and cost: where a run's billed time went, what it cost, and the checkpoint interval that wastes least.

- `timeline`: the versioned record of one run's time by category (standard library only, Python 3.8,
  no other infra import: it moves into the shared contract package the agent will write it with).
- `pricing`: a timeline in chip-hours and list-price USD, priced by infra/cost.py.
- `whatif`: before launch, the expected time and cost of a job and its best checkpoint interval.

docs/goodput.md has the formulas, when each applies, and their sources.
"""
