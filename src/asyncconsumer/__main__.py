"""``python -m asyncconsumer``: the command-line tool (see docs/cli.md)."""

from .cli import run

if __name__ == "__main__":
    run()
