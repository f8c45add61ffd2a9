"""What a reader meets first stays readable: the README's lines outside code blocks, and the
cells of docs/benchmarks.md's tables (the history of runs lives in benchmarks/results/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_LINE = 300  # characters, outside code blocks
BENCHMARKS_CELL = 400  # characters in a table cell
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def long_lines(text: str, limit: int) -> list[tuple[int, int]]:
    """(line number, length) of each line over ``limit`` outside fenced code blocks."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and len(line) > limit:
            found.append((number, len(line)))
    return found


def long_cells(text: str, limit: int) -> list[tuple[int, int]]:
    """(line number, length) of each table cell over ``limit``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|"):
            for cell in CELL_SPLIT.split(line.strip().strip("|")):
                if len(cell.strip()) > limit:
                    found.append((number, len(cell.strip())))
    return found


def test_the_readme_has_no_line_over_300_characters_outside_code():
    assert long_lines((ROOT / "README.md").read_text(encoding="utf-8"), README_LINE) == []


def test_benchmarks_md_has_no_table_cell_over_400_characters():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert long_cells(text, BENCHMARKS_CELL) == []


def test_the_readme_keeps_its_front_door_commands_and_a_short_performance_table():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text and ".ci/run" in text
    table = text.split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # less the head
    assert 0 < len(rows) <= 10


def test_the_checks_find_what_they_look_for():
    code = "```\n" + "x" * 500 + "\n```\n"
    assert long_lines(code + "y" * 301 + "\n" + "z" * 300, README_LINE) == [(4, 301)]
    table = "| a | b |\n|---|---|\n| " + "c" * 401 + " | d \\| e |\n"
    assert long_cells(table, BENCHMARKS_CELL) == [(3, 401)]
