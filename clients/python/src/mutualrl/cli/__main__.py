"""`python -m mutualrl.cli ...`, the same as the `mutualrl` command."""

import sys

from mutualrl.cli import main

sys.exit(main())
