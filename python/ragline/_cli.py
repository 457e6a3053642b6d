"""The ``ragline`` console script: the command run in this process, with the binary's flags,
output and exit codes."""

import signal
import sys

from . import _ragline


def main() -> None:
    # As the binary: Ctrl-C ends the process (ragline's own handlers, where a command has
    # them, take over), and nothing of Python's runs while the command does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_ragline.cli_main(["ragline", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
