"""The ``madqn`` command: one subcommand per module, registered with ``@command``
(madqn.cli.registry); errors are one line, exit code 2.

Nothing in madqn imports this package except ``madqn.__main__``: ``import madqn`` does not load
the command line.
"""

from __future__ import annotations

import argparse
import sys

# the subcommands, in the order ``madqn --help`` lists them (importing a module registers its commands)
import madqn.cli.train  # noqa: F401  (madqn train)
import madqn.cli.view  # noqa: F401  (madqn plot, madqn video)
import madqn.cli.bench  # noqa: F401  (madqn bench)
import madqn.cli.evaluate  # noqa: F401  (madqn eval, madqn compare)
import madqn.cli.export  # noqa: F401  (madqn export)
from madqn.cli.registry import COMMANDS
from madqn.errors import MadqnError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="madqn", description="Multi-agent DQN3.0 for PettingZoo environments.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MadqnError as e:
        if args.debug:
            raise
        print(f"madqn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before training started (afterwards it stops the run gracefully)
        if args.debug:
            raise
        print("madqn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
