"""``python -m train``: a Python without the project's packages gets one line saying where they are."""

from core.installed import require

require("train", ("click", "torch"))

from train.cli import main  # noqa: E402

main()
