"""``python -m bench.lifecycle``: the lifecycle benchmark (see the package docstring)."""

import sys

from bench.lifecycle.main import main

if __name__ == "__main__":
    sys.exit(main())
