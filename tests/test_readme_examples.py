"""The examples of the docs pages, executed: the error example, the cost table, the stack outputs and
the commands they give, and the settings table. Each example is found by its `<!-- example: ... -->`
marker in whichever page of docs/ holds it; a page that drifts from what the code prints fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from infra.cost import cost_table
from tests.support import offline_cli, plan, stack_config
from tools.offline import dev_examples
from tools.offline.dev_examples import dev_with
from tools.offline.render import to_text

ROOT = Path(__file__).resolve().parents[1]
DOCS = "\n".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))


def readme_tpu_runs() -> dict[str, dict[str, str]]:
    """The README's `tpu-runs` table, both engines side by side: {engine: {command: its line}}; a cell that
    is no command (a feature not there yet on that engine) is left out."""
    readme = (ROOT / "README.md").read_text()
    start = readme.find("<!-- example: tpu-runs on both engines")
    assert start >= 0, "the README lost its tpu-runs table"
    table = []
    for line in readme[start:].splitlines()[1:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    engines = table[0][1:]
    found: dict[str, dict[str, str]] = {engine: {} for engine in engines}
    for row in table[2:]:
        for engine, cell in zip(engines, row[1:], strict=True):
            if command := re.fullmatch(r"`(tpu-runs .*)`", cell):
                found[engine][row[0]] = command[1]
    return found


def readme_argv(line: str, **values: str) -> list[str]:
    """A README command as `tpu-runs`' arguments, less the `--stack dev` a test gives its own stack file for,
    with `$NAME`s filled in."""
    for name, value in values.items():
        line = line.replace(f"${name}", value)
    argv = shlex.split(line)
    assert argv[0] == "tpu-runs" and argv[2:4] == ["--stack", "dev"], line
    return [argv[1], *argv[4:]]


def test_the_readme_shows_both_engines_side_by_side():
    commands = readme_tpu_runs()
    assert list(commands) == ["VM engine", "GKE engine"]
    assert list(commands["VM engine"]) == ["submit", "list", "logs", "fetch", "stop"]
    assert list(commands["GKE engine"]) == ["submit", "list", "logs", "fetch", "stop"]
    for engine, flag in (("VM engine", "--vm"), ("GKE engine", "--team")):
        for name, line in commands[engine].items():
            assert line.startswith(f"tpu-runs {name} --stack dev"), line
            assert flag in line or (engine, name) == ("VM engine", "list"), line  # list --stack: every VM


def example(marker: str) -> str:
    """The fenced block that follows `<!-- example: MARKER`."""
    start = DOCS.find(f"<!-- example: {marker}")
    assert start >= 0, f"the docs lost their example marker {marker!r}"
    return DOCS[start:].split("```", 2)[1].split("\n", 1)[1]  # past the fence's language tag


def test_the_error_example_is_what_the_plan_prints(tmp_path):
    marker = re.search(r"<!-- example: Pulumi\.dev\.yaml with (\w+): (\S+) \(", DOCS)
    assert marker, "the docs' error example lost its marker"
    key, value = marker.groups()
    shown = DOCS[marker.end() :].split("```\n", 1)[1].split("```", 1)[0]
    draft = tmp_path / "Pulumi.dev.yaml"
    draft.write_text(dev_with(key, value))
    done = offline_cli("plan", "--stack-file", str(draft))
    assert done.returncode == 2
    assert done.stderr == shown


def test_golden_write_rewrites_the_examples_of_devs_own_output(tmp_path, monkeypatch):
    """A team that edits dev runs `golden --write` (docs/development.md): both examples come back as the
    command prints them, and nothing else on their pages moves."""
    for name, marker in (("ERROR_PAGE", "<!-- example: Pulumi.dev.yaml with"), ("COST_PAGE", dev_examples.COST_MARKER)):
        page = getattr(dev_examples, name).read_text()
        stale = tmp_path / getattr(dev_examples, name).name
        stale.write_text(dev_examples._with_block(page, page.index(marker), "an older dev's output\n"))
        monkeypatch.setattr(dev_examples, name, stale)
    assert sorted(path.name for path in dev_examples.write()) == ["cost-and-lifecycle.md", "offline-plan.md"]
    for name in ("ERROR_PAGE", "COST_PAGE"):
        assert getattr(dev_examples, name).read_text() == (ROOT / "docs" / getattr(dev_examples, name).name).read_text()
    assert dev_examples.write() == []


def test_the_settings_table_is_generated_from_the_declarations():
    from infra.config import docs

    page = docs.SETTINGS_PAGE.read_text()
    assert docs.page_with_table(page) == page, (
        "docs/stack-settings.md's settings table is stale: run .venv/bin/python -m tools.offline schema --write"
    )


def test_the_cost_table_is_what_the_plan_prints():
    dev = plan(stack_config("dev"), "dev")
    shown = example("the cost table of `make plan` (dev)")
    assert shown == cost_table(dev.outputs["costEstimate"]) + "\n"
    assert shown in to_text(dev)  # the plan prints it as such


def test_the_what_if_example_is_what_the_command_prints():
    command, shown = example("`python -m tools.offline whatif` of a spot v5litepod-8 job").split("\n", 1)
    done = offline_cli(*shlex.split(command.removeprefix("$ python -m tools.offline ")))
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


def test_the_stack_outputs_and_the_vm_commands_are_what_the_program_exports():
    dev = plan(stack_config("dev"), "dev")
    listed = re.search(r"Stack outputs: (.*?)\.\n", DOCS, re.S)
    assert listed, "the docs lost their list of stack outputs"
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(dev.outputs)
    ssh, logs = example("`pulumi stack output tpuVms` of dev").replace(" \\\n  ", " ").splitlines()[1::2]
    assert (ssh, logs) in [(vm["sshCommand"], vm["logsCommand"]) for vm in dev.outputs["tpuVms"].values()]


def test_the_smoke_tests_price_is_what_its_dry_run_prints(capsys):
    from tools import smoke

    command, shown = example("the first line of the smoke test's dry run").split("\n", 1)
    assert smoke.main(shlex.split(command.removeprefix("$ python -m tools.smoke "))) == 0
    assert capsys.readouterr().out.splitlines(keepends=True)[0] == shown
