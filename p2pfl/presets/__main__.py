import sys

from p2pfl.errors import UserError
from p2pfl.presets import listing

try:
    print(listing())
except UserError as exc:
    print(f"p2pfl.presets: error: {exc}", file=sys.stderr)
    sys.exit(2)
