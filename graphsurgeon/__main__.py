"""``python -m graphsurgeon``: the ``graphsurgeon`` command (:func:`graphsurgeon.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
