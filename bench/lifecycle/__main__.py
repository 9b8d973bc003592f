"""``python -m bench.lifecycle``: the lifecycle benchmark (see the package docstring)."""

import sys

from bench.lifecycle.main import main

sys.exit(main())
