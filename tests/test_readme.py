"""The README stays short and true: its methods table is what ``placetool search --list``
says (``python -m tests.readme`` regenerates it), its commands table names every command,
and every relative link in it and in docs/ leads to a file."""

from __future__ import annotations

import re

from tests.readme import README, ROOT, methods_table, readme_methods


def test_the_methods_table_is_generated_from_search_list():
    assert readme_methods(README.read_text()) == methods_table(), \
        "README.md's methods table is stale: run `python -m tests.readme` from the repository's root"


def test_the_methods_table_renders_each_field():
    table = methods_table({"a|b": {"summary": "x | y", "default_budget": {"evals": 5000, "seconds": None},
                                   "seed": 3, "module": "m"}})
    assert table.splitlines()[2] == "| `a|b` | x \\| y | 5,000 evals | yes |"


def test_the_commands_table_names_every_command():
    from placetool.cli.main import COMMANDS

    section = README.read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z-]+)` \|", section, re.M)
    assert sorted(listed) == sorted(COMMANDS), "one line per `placetool` command in README.md's commands table"
    assert len(listed) == len(set(listed))


def test_the_readme_stays_short():
    # the details live in docs/ (README.md, "Documentation")
    assert len(README.read_text().splitlines()) <= 150


def test_relative_links_lead_to_files():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken
