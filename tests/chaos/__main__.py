"""``python -m tests.chaos``: a chaos run from the command line (see runner.parser())."""

from __future__ import annotations

import sys

from tests.chaos.runner import finish_opts, parser, run


def main() -> int:
    opts = finish_opts(parser().parse_args())
    status, _ = run(opts)
    return status


if __name__ == "__main__":
    sys.exit(main())
