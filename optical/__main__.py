"""``python -m optical``: the ``optical`` command."""

import sys

from optical.cli import main

if __name__ == "__main__":
    sys.exit(main())
