"""The README's two commands are what they say: the test command is the one CI runs, verbatim."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_a_train_command_and_the_test_command_ci_runs():
    train, test = _readme_commands()
    assert "mgpu launch" in train and train.startswith("python3 -m venv .venv && ")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci, "the README's test command and .ci/run must be the same line"
    assert "ruff check ." in test and "pytest" in test
