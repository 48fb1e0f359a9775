"""What ``train`` and ``launch`` both stand on: input safety, error types, click option
types, the run-directory layout, and the hardware catalog (profiles and fabrics, YAML data).

It imports neither ``train`` nor ``launch``, and never ``torch``.
"""
