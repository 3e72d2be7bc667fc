"""``python -m optical``: the ``optical`` command."""

import sys

from optical.cli import main

sys.exit(main())
