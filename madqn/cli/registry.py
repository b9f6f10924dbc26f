"""The ``madqn`` subcommands: each command module registers its parser with ``@command``."""

from __future__ import annotations

import argparse
from typing import Callable

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def command(register: Callable[[argparse._SubParsersAction], None]) -> Callable:
    """Add a function that adds one subcommand's parser (``sub.add_parser(...)``) to ``madqn``."""
    COMMANDS.append(register)
    return register
