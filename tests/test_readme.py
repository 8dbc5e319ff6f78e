"""The README's two fresh-machine commands are the ones CI and users run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [c.strip() for c in re.findall(r"```\n(.*?)\n```", text, flags=re.S)]


def test_readme_has_exactly_two_commands() -> None:
    cmds = _readme_commands()
    assert len(cmds) == 2
    assert cmds[0].endswith("pearl-moe run")
    assert cmds[1].endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in [line.strip() for line in ci]
