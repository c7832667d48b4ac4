"""Console entry point of `fleetd`."""

import sys


def _is_serve(argv):
    """True when the first non-option argument is the `serve` command."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg == "serve"
    return False


def main(argv=None):
    """Run the fleetd CLI; `serve` patches the standard library for gevent first."""
    argv = sys.argv[1:] if argv is None else argv
    if _is_serve(argv):
        from gevent import monkey

        monkey.patch_all()
    from fleetd.cli import cli

    return cli.main(args=argv, prog_name="fleetd")


if __name__ == "__main__":
    main()
