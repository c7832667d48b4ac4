"""Console entry point of `fleetd`."""

import sys
from typing import NoReturn


def _is_serve(argv):
    """True when the first non-option argument is the `serve` command."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg == "serve"
    return False


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the fleetd CLI; `serve` patches the standard library for gevent first."""
    argv = sys.argv[1:] if argv is None else argv
    if _is_serve(argv):
        from gevent import monkey

        monkey.patch_all()
    from fleetd.cli import cli

    cli.main(args=argv, prog_name="fleetd")  # exits: click's standalone mode


if __name__ == "__main__":
    main()
