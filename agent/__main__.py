"""Entry point of `fleet-agent` and `python -m agent`."""

from agent.cli import cli


def main() -> None:
    """Run the fleet-agent command line."""
    cli(prog_name="fleet-agent")


if __name__ == "__main__":
    main()
