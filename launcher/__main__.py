"""``python -m ignis.launcher``: the ``ignis`` command."""

import sys

from ignis.launcher.cli import main

sys.exit(main())
