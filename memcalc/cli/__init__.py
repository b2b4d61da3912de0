"""The ``memcalc`` command: one more client of ``memcalc.api``.

Commands declare their options and call one function. A user's mistake ends in one line on stderr and exit code 2,
never a traceback. ``app`` (memcalc.cli.app) is the typer application; importing the command modules registers them.
"""

from __future__ import annotations

import gc
import os
import sys

# Importing a command module registers its commands, in the order --help lists them.
from memcalc.cli import estimate  # noqa: F401, I001
from memcalc.cli import plan  # noqa: F401, I001
from memcalc.cli import catalogues  # noqa: F401, I001
from memcalc.cli import tools  # noqa: F401, I001
from memcalc.cli.app import EXIT_USAGE, app, fail

__all__ = ["EXIT_USAGE", "app", "fail", "main"]


def main() -> None:
    # A command is a short process whose objects live until it exits: the cyclic collector would only walk the
    # classes, schemas and modules it makes (some 50 passes in an estimate, 10-17 ms of CPU), never to free them.
    # Reference counting still frees everything else; a plan's search grows by 3 MiB without it. The commands that
    # run real training steps (validate, trace) turn it back on.
    gc.disable()
    # pydantic looks for plugins in every installed distribution's entry points (importlib.metadata) before it builds
    # its first validator: a third of what a command's validation costs. The command line uses none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # typer builds a click command, option by option, for every registered command before it dispatches: when the
    # first argument names a command, build only that one (help and mistakes still see them all).
    argv = sys.argv[1:]
    if argv and not argv[0].startswith("-"):
        only = [c for c in app.registered_commands if (c.name or c.callback.__name__).replace("_", "-") == argv[0]]
        if only:
            app.registered_commands = only
    try:
        app()
    finally:
        # The interpreter's exit collects every object still tracked, once more (26 ms of an estimate's CPU, all of
        # it on objects the process is about to give back): frozen, they are left to the exit (atexit and the
        # modules' teardown still run).
        gc.freeze()


if __name__ == "__main__":
    main()
