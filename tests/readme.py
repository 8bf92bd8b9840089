"""The README's generated table of search methods, rendered from ``placetool search
--list --json``.

``python -m tests.readme`` (from the repository's root) rewrites the table between the
README's ``methods`` markers; ``tests/test_readme.py`` checks that the README's table is
the one this renders.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- methods: generated from `placetool search --list` by `python -m tests.readme` -->"
END = "<!-- /methods -->"


def cli_json(*args: str) -> dict:
    """The JSON that ``placetool ARGS`` prints, run in this process."""
    from click.testing import CliRunner

    from placetool.cli.main import cli

    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _budget(b: dict) -> str:
    parts = ([f"{b['seconds']:g} s"] if b["seconds"] else []) + ([f"{b['evals']:,} evals"] if b["evals"] else [])
    return ", ".join(parts)


def methods_table(methods: dict | None = None) -> str:
    """The methods as a Markdown table: name, summary, default budget, and whether sa,
    tpe and rl start from the method's placement."""
    methods = cli_json("search", "--list", "--json")["methods"] if methods is None else methods
    rows = ["| method | what it does | default budget | seeds sa/tpe/rl |", "|---|---|---|:-:|"]
    for name, m in methods.items():
        summary = m["summary"].replace("|", "\\|")
        rows.append(f"| `{name}` | {summary} | {_budget(m['default_budget'])} | {'yes' if m['seed'] else ''} |")
    return "\n".join(rows)


def readme_methods(text: str) -> str:
    """The table between the README's markers."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert m, f"README.md has no generated methods table (markers {BEGIN!r} ... {END!r})"
    return m.group(1)


def write(path: Path = README) -> bool:
    """Put the current table into the README; whether it changed."""
    text = path.read_text()
    new = text.replace(f"{BEGIN}\n{readme_methods(text)}\n{END}", f"{BEGIN}\n{methods_table()}\n{END}")
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    print("README.md: methods table " + ("updated" if write() else "already current"), file=sys.stderr)
