"""``python -m train``: a Python without the project's packages gets one line saying where they are."""

import importlib.util
import sys

missing = next((m for m in ('click', 'torch') if importlib.util.find_spec(m) is None), None)
if missing:
    sys.stderr.write(f"error: {missing} is not installed in this Python ({sys.executable}): run `make setup` "
                     "and use .venv/bin/train, or `source .venv/bin/activate` first\n")
    raise SystemExit(2)

from train.cli import main  # noqa: E402

main()
