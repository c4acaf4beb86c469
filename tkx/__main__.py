"""``python -m tkx`` runs the ``tkx`` command."""

import sys

from tkx.cli import main

sys.exit(main())
