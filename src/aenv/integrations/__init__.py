"""Integrations of aenv with the harnesses RL trainers use, each a thin module over
``aenv.client``. See ``docs/integrations.md``.

* :mod:`aenv.integrations.harbor`: a Harbor environment (``harbor run -e
  aenv.integrations.harbor:AenvEnvironment``) that builds each task's template once and forks
  one sandbox per trial from a prepared parent.

Each module imports without its framework installed (aenv's own venv has none of them); only
the classes that subclass the framework's load it, on first use.
"""
