"""``python -m tools.kafka_image [--libs DIR] [--tag TAG] [--force]``: make the local Kafka image."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DEFAULT_TAG, ImageBuildError, ensure_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kafka_image", description=__doc__)
    parser.add_argument("--libs", type=Path, default=None,
                        help="directory of the broker's jars (default: KafkaBroker's, for the reference release)")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image tag (default {DEFAULT_TAG})")
    parser.add_argument("--force", action="store_true", help="build even when an image of the same recipe exists")
    options = parser.parse_args(argv)
    try:
        built = ensure_image(options.libs, options.tag, force=options.force)
    except ImageBuildError as exc:
        print(f"kafka_image: {exc}", file=sys.stderr)
        return 1
    state = f"built in {built.seconds:.1f} s" if built.built else "up to date"
    print(f"{built.tag}: {state} (recipe {built.recipe})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
