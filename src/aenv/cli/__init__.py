"""The ``aenv`` command line: the host-side edge where sync meets aenv's async code.

Each sub-command lives in its own module and is mounted on the root app in ``main.py``. Nothing
below the CLI imports it.
"""
