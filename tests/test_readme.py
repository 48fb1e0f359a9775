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


def test_the_presets_the_readme_lists_are_the_preset_files():
    import re

    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"`--config` takes a preset \(([^)]*)\)", readme)
    assert listed, "the README's list of --config presets moved"
    names = set(re.findall(r"`([^`]+)`", listed.group(1).split(":")[0]))
    assert names == {p.stem for p in (ROOT / "train" / "configs").glob("*.yaml")}
