"""One option vocabulary across commands; old spellings still parse but are hidden."""

import io
import re

import click
import pytest

from placetool.cli.common import Progress
from placetool.cli.main import COMMANDS, cli

# long name -> the short name it has wherever it appears (None: it has none anywhere)
VOCABULARY = {"--graph": "-g", "--cluster": "-c", "--placement": "-p", "--out": "-o", "--profile": None,
              "--budget-seconds": None, "--budget-evals": None, "--workers": "-n", "--quiet": "-q",
              "--json": None}


def _commands():
    ctx = click.Context(cli)
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return out


@pytest.mark.parametrize("name,cmd", _commands(), ids=[n for n, _ in _commands()])
def test_shared_options_have_one_spelling(name, cmd):
    for p in cmd.params:
        if not isinstance(p, click.Option):
            continue
        shown = [o for o in p.opts if o not in getattr(p, "old_opts", ())]
        for long, short in VOCABULARY.items():
            if long in shown:
                shorts = [o for o in shown if re.fullmatch(r"-[A-Za-z]", o)]
                assert shorts == ([short] if short else []), f"{name} {long}: {shown}"
        # a short name of the vocabulary never means something else
        for long, short in VOCABULARY.items():
            if short and short in shown:
                assert long in shown, f"{name}: {short} is {shown}, not {long}"
    if any(isinstance(p, click.Option) and "--profile" in p.opts for p in cmd.params):
        prof = next(p for p in cmd.params if "--profile" in p.opts)
        assert isinstance(prof.type, click.Path) and prof.metavar == "FILE"


def _parse(cmd_path, args):
    ctx = click.Context(cli)
    cmd = cli
    for part in cmd_path.split():
        cmd = cmd.get_command(ctx, part)
    return cmd.make_context(cmd_path, list(args)).params


def test_old_spellings_still_parse_to_the_same_parameter():
    new = _parse("rl pretrain", ["-g", "a,b", "-c", "k80x2", "-o", "pol", "--budget-seconds", "5"])
    old = _parse("rl pretrain", ["--graphs", "a,b", "--clusters", "k80x2", "--out", "pol", "--seconds", "5"])
    assert old == new
    assert old["graphs"] == ("a,b",) and old["clusters"] == ("k80x2",) and old["budget_seconds"] == 5.0
    assert _parse("sweep", ["s.toml", "-w", "3"])["workers"] == _parse("sweep", ["s.toml", "-n", "3"])["workers"] == 3


def test_old_spellings_are_not_in_help():
    ctx = click.Context(cli)
    pre = cli.get_command(ctx, "rl").commands["pretrain"]
    text = pre.get_help(click.Context(pre, info_name="pretrain"))
    assert "--graph " in text and "--graphs" not in text and "--seconds" not in text
    sw = cli.get_command(ctx, "sweep")
    text = sw.get_help(click.Context(sw, info_name="sweep"))
    assert "-n, --workers" in text and not re.search(r"(?<![-\w])-w\b", text)


def test_old_spelling_end_to_end(tmp_path):
    """`sweep -w` (the old spelling) still runs a dry run through the real command."""
    from click.testing import CliRunner

    f = tmp_path / "s.toml"
    f.write_text('[sweep]\ngraphs = ["synthetic-20"]\nclusters = ["k80x2"]\nmethods = ["single"]\nbudget_evals = 4\n')
    r = CliRunner().invoke(cli, ["sweep", str(f), "--results", str(tmp_path / "r.db"), "-w", "1", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "1 grid points, 1 to run" in r.output


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_shows_best_and_ends_at_100_percent():
    f = _Tty()
    with Progress(1000, "searching", file=f) as bar:
        bar.advance_to(400, 2500.0)
        bar.advance_to(990, 1234.5)  # the budget callback rarely lands on the last step
    text = f.getvalue()
    assert "100%" in text and "best 1,234.5 µs" in text
    assert bar.pos == 1000


def test_progress_bar_stops_where_it_was_on_error():
    f = _Tty()
    with pytest.raises(KeyboardInterrupt):
        with Progress(10, "runs", file=f) as bar:
            bar.update(3)
            raise KeyboardInterrupt
    assert bar.pos == 3 and "100%" not in f.getvalue()
