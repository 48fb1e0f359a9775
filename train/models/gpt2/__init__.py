"""The GPT-2 family: ``model.py`` (the modules, torch) and ``spec.py`` (presets, shapes, the
parallelism plan: no torch). Registered in ``train/models/registry.py``."""
