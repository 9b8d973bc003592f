"""Integrations of aenv with the harnesses RL trainers use, each a thin module over
``aenv.client``. See ``docs/integrations.md``.

* :mod:`aenv.integrations.harbor`: a Harbor environment (``harbor run -e
  aenv.integrations.harbor:AenvEnvironment``) that builds each task's template once and forks
  one sandbox per trial from a prepared parent.
* :mod:`aenv.integrations.openenv`: an OpenEnv ``ContainerProvider`` that gives each
  environment client a fork child of one prepared parent per environment image.

``harbor`` imports without Harbor installed (Harbor needs Python >= 3.12); ``openenv``
imports OpenEnv, which is in aenv's dev extra.
"""
