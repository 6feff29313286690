"""``python -m sssd.cli`` runs the ``sssd`` command."""

import sys

from sssd.cli import main

sys.exit(main())
