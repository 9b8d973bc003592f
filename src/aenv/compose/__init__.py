"""The node's composition root: every part opened from the settings, the frozen ``Node``,
its services started and closed in reverse (``root.py``)."""
