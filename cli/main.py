"""Entry point: a click group whose subcommands load on first use.

Each command lives in its own module and is imported only when run, so that
``placetool simulate`` never pays for TensorFlow, Optuna or Dask.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from placetool.costmodel.errors import UserError

# name -> "module:attribute"; a module that is not there yet is simply not listed.
COMMANDS = {
    "simulate": "placetool.cli.simulate:simulate",
    "info": "placetool.cli.info:info",
    "import": "placetool.cli.importer:import_cmd",
    "search": "placetool.cli.search:search",
    "calibrate": "placetool.cli.hardware:calibrate",
    "verify": "placetool.cli.hardware:verify",
    "testbed": "placetool.cli.hardware:testbed",
    "sweep": "placetool.cli.sweep:sweep",
    "report": "placetool.cli.sweep:report",
    "rl": "placetool.cli.rl:rl",
    "export": "placetool.cli.export:export",
    "show": "placetool.cli.show:show",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [n for n, target in COMMANDS.items() if importlib.util.find_spec(target.split(":")[0])]

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        if importlib.util.find_spec(module) is None:
            return None
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="placetool")
def cli():
    """placetool: place neural-network dataflow graphs on devices.

    Times are in microseconds, sizes in bytes. Graphs and clusters are given by bundled
    name (see `placetool info --list`) or by path.
    """


def main(argv=None) -> None:
    """Run the CLI; user mistakes print one line on stderr and exit 2."""
    try:
        rv = cli.main(args=argv, prog_name="placetool", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("placetool: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except UserError as e:
        click.echo(f"placetool: error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("placetool: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
