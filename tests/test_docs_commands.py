"""Every command in README.md and docs/*.md is executed: an example that fails as written
fails this test.

How a page is exercised (the convention, in full in tests/docs_blocks.py):

* ```` ```bash ````/```` ```sh ````/```` ```shell ```` blocks run as written, in page order, in one
  bash session (``set -euo pipefail``) per page: variables, files and ``cd`` carry over
  between the blocks of a page. The working directory is a scratch directory with links to
  the repository's top-level entries (``scripts/``, ``tests/``, ...); ``train``, ``launch``,
  ``torchrun`` and ``python`` are this environment's, importing this checkout. A runnable
  example is CPU-sized (tiny presets, few steps); each page has ``PAGE_TIMEOUT_S``.
* ```` ```console ```` blocks: only the ``$ ``-prompted lines run; the rest is output.
* ``<!-- docs-test: render REASON -->`` just before a block: it needs what this machine lacks
  (GPUs, a cluster). ``launch`` commands in it still run (rendering needs no GPU); every
  other command gets the check tests/docs_render.py describes (``torchrun ... -m train run``:
  the config validated for the world size the command implies).
* ``<!-- docs-test: skip REASON -->``: not exercised (building an image, a download).
* ``<!-- docs-test: setup`` + commands + ``-->``: run first, invisible on the rendered page;
  it creates what the examples assume the reader has (a corpus, a tokenizer).
* Output is shown in ```` ```text ```` blocks and not executed; untagged fences and indented
  code blocks are refused.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import page_script, parse_page, read_render_log
from docs_render import check

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
PAGE_TIMEOUT_S = 600  # a hang guard; the pages' commands take seconds each
DATA_EXTRA = ("datasets", "tokenizers", "pyarrow")  # what tests/docs_fixtures.py data-inputs uses

# Pages whose commands fail as written and that are being rewritten: not run, so each shows as
# XFAIL. Empty: every page's commands run as written.
PENDING_REWRITE: dict[str, str] = {}


def _env(tmp: Path, fixtures_cache: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    if not (Path(bin_dir) / "python").exists():  # only python3 (Debian, the image): `python` is this one
        (tmp / "bin").mkdir(exist_ok=True)
        (tmp / "bin" / "python").symlink_to(sys.executable)
        bin_dir += os.pathsep + str(tmp / "bin")
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               DOCS_RENDER_LOG=str(tmp / "render.log"), OMP_NUM_THREADS="1")
    env.pop("TRAIN_DEBUG", None)
    env.pop("DOCS_FIXTURES_CACHE", None)
    if fixtures_cache is not None:  # setup inputs made once per session (tests/docs_fixtures.py)
        env["DOCS_FIXTURES_CACHE"] = str(fixtures_cache)
    return env


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "runs"}:  # .venv too: `source .venv/bin/activate` as the README says
            (work / entry.name).symlink_to(entry)
    if not (ROOT / ".venv").is_dir():  # installed without the checkout's venv (inside the image)
        venv_bin = work / ".venv" / "bin"
        venv_bin.mkdir(parents=True)
        (venv_bin / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    return work


def _run_page(rel: str, tmp: Path, path: Path | None = None, fixtures_cache: Path | None = None) -> None:
    page = parse_page(path or ROOT / rel)
    assert page.problems == [], "\n".join(page.problems)
    script, where = page_script(page, rel)
    (tmp / "page.sh").write_text(script)
    work = _workdir(tmp)
    proc = subprocess.Popen(["bash", str(tmp / "page.sh")], cwd=work, env=_env(tmp, fixtures_cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{rel}: its commands ran over {PAGE_TIMEOUT_S} s (show a CPU-sized example):\n{out[-3000:]}")
    if proc.returncode:
        line = next((int(w.split()[-1]) for w in reversed(out.splitlines())
                     if w.startswith("docs-test: exit status")), 0)
        pytest.fail(f"{where.get(line, rel)}: this command fails as written (exit {proc.returncode}):\n{out[-3000:]}")
    for at, cwd, argv in read_render_log(tmp / "render.log"):
        try:
            check(argv, cwd)
        except AssertionError as exc:
            raise AssertionError(f"{at} (render check): {exc}") from None


@pytest.mark.parametrize("rel", [pytest.param(p, marks=pytest.mark.xfail(reason=f"pending rewrite: {PENDING_REWRITE[p]}",
                                                                        run=False))
                                 if p in PENDING_REWRITE else p for p in PAGES])
def test_every_command_of_the_page_works_as_written(rel, tmp_path, fixtures_cache):
    if "docs_fixtures.py data-inputs" in (ROOT / rel).read_text():  # its examples prepare data sets
        missing = [m for m in DATA_EXTRA if importlib.util.find_spec(m) is None]
        if missing:
            pytest.skip(f"{rel}: needs the data extra ({', '.join(missing)} missing): pip install -e '.[data]'")
    _run_page(rel, tmp_path, fixtures_cache=fixtures_cache)


@pytest.fixture(scope="session")
def fixtures_cache(tmp_path_factory) -> Path:
    """Where tests/docs_fixtures.py keeps what a page's setup makes, for the next page."""
    return tmp_path_factory.mktemp("docs-fixtures")


# ----------------------------------------------------------------------------- the mechanism itself


def _page(tmp: Path, text: str) -> Path:
    (tmp / "page").mkdir()
    path = tmp / "page" / "page.md"
    path.write_text(text)
    return path


FENCE = "```"


def test_blocks_share_one_session_and_a_failing_command_names_its_line(tmp_path):
    text = (f"{FENCE}bash\nNAME=docs\necho hi > note.txt\n{FENCE}\n\n{FENCE}text\nnot run\n{FENCE}\n\n"
            f"<!-- docs-test: skip needs the network -->\n{FENCE}bash\nfalse\n{FENCE}\n\n"
            f"{FENCE}sh\ntest \"$NAME\" = docs && grep -q hi note.txt\n"
            f"ls \\\n   /no/such/dir\n{FENCE}\n")
    with pytest.raises(pytest.fail.Exception, match=r"page.md:17: this command fails as written"):
        _run_page("page.md", tmp_path, _page(tmp_path, text))


def test_render_blocks_run_launch_and_check_the_training_config(tmp_path):
    ok = (f"<!-- docs-test: render needs 8 GPUs -->\n{FENCE}bash\nlaunch torchrun --nnodes 2 -o job.sh -- --config 8b\n"
          "torchrun --nproc-per-node 8 -m train run --config 8b \\\n  --set parallel.strategy=fsdp --set parallel.tp=2\n"
          f"{FENCE}\n{FENCE}bash\ntest -s job.sh\n{FENCE}\n")
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    _run_page("page.md", tmp_path / "a", _page(tmp_path / "a", ok))
    bad = ok.replace("parallel.tp=2", "parallel.tp=3")
    with pytest.raises(AssertionError, match=r"page.md:4 \(render check\).*on 8 rank\(s\).*parallel"):
        _run_page("page.md", tmp_path / "b", _page(tmp_path / "b", bad))


def test_untagged_fences_indented_code_and_reasonless_markers_are_refused(tmp_path):
    page = parse_page(_page(tmp_path, f"{FENCE}\ntrain run\n{FENCE}\n\n    indented\n\n"
                                      f"<!-- docs-test: skip -->\n{FENCE}bash\nx\n{FENCE}\n"))
    assert [p.split(": ", 1)[1][:24] for p in page.problems] == [
        "fence language '' is not", "indented code block; fen", "docs-test: skip needs a "]
