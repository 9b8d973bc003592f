"""``python -m aenv.core.settings > docs/config.md``."""

import sys

from aenv.core.settings import reference_markdown

sys.stdout.write(reference_markdown())
