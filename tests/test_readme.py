"""README promises that must stay true."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_names_the_two_setup_commands_and_ci_runs_make_test():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_linked_result_file_exists():
    import re

    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\(((?:docs|scripts|docker|k8s)/[^)#]+)\)", readme):
        assert (ROOT / link).exists(), link
