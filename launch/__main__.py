"""``python -m launch``: a Python without the project's packages gets one line saying where they are."""

from core.installed import require

require("launch", ("click", "jinja2", "yaml"))

from launch.cli import main  # noqa: E402

raise SystemExit(main())
