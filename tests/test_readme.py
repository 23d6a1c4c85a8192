"""The README's code works as written: every ```python block runs, in order, in one namespace
(as a reader pastes them into one notebook), and every command it names exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of each fenced block in ``language``."""
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```", README, flags=re.M | re.S):
        found.append((README[: match.start()].count("\n") + 1, match.group(1)))
    return found


def test_the_readme_has_code_to_check():
    assert len(blocks("python")) >= 5 and len(blocks("bash")) >= 1


@pytest.mark.skipif(shutil.which("dot") is None, reason="the README draws pictures")
def test_every_python_block_runs_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a block that writes a file writes it here
    namespace: dict = {"__name__": "__readme__"}
    for line, code in blocks("python"):
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"the README's block at line {line} fails: {error!r}") from error
    out = capsys.readouterr().out
    assert "swappable" in out and "verify: match" in out


def test_every_make_target_and_command_it_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    named = set(re.findall(r"`make (\w[\w-]*)`", README))
    for _, code in blocks("bash"):
        named |= set(re.findall(r"^make (\w[\w-]*)", code, flags=re.M))
    assert named and named <= targets, named - targets
    commands = set(re.findall(r"`graphsurgeon (\w+)", README))
    assert commands
    for command in sorted(commands):
        result = subprocess.run(
            [sys.executable, "-m", "graphsurgeon", command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (command, result.stderr)
