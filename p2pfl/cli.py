"""The p2pfl-run console script, as `python -m p2pfl.run`: the early stop handlers first (torch takes
seconds to load, and a Ctrl-C then must not be lost), then the CLI."""

import sys


def main() -> None:
    from p2pfl.stopping import quiet_until_started

    quiet_until_started()
    from p2pfl.run import main as run

    sys.exit(run())
