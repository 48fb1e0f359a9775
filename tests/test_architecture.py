"""The architecture rules of docs/architecture.md, checked on the source with ``ast`` (no import).

The import graph and the size limits are computed in one place, scripts/check_architecture.py
(also a command); an import counts wherever it stands (module level or inside a function).
"Upward" means, concretely:

* a leaf module (``LEAVES``: errors, console, paths, compat, defaults, envnames, safety, homepath, clicktypes) imports no
  module of ``train`` or ``launch`` except other leaves;
* no module imports a package aggregator above it: a package's ``__init__`` (``train``,
  ``train.parallel``, ``launch.backends`` ...) is never imported from inside that package
  (``from train.parallel import fsdp`` names the module ``train.parallel.fsdp``, which is fine;
  ``from train.parallel import parallelize`` inside ``train/parallel/`` is not);
* a command line (a module named ``cli`` or ``__main__``) is imported only by the command line
  of the same or an enclosing package: ``train.cli`` imports ``train.doctor.cli``, nothing
  imports ``train.cli`` but ``train.__main__``;
* the model knows nothing of parallelism, precision or the loop: ``train.models`` imports only
  itself and leaves;
* ``train`` and ``launch`` stand side by side on ``core`` (input safety, errors, click types,
  run layout, the hardware catalog): neither imports the other, ``core`` imports neither, and
  ``launch`` and ``core`` never import ``torch`` (tests/launch/test_launch_cli.py checks the same
  at run time for a render).
"""

from __future__ import annotations

import ast
import re

import pytest

from testlib import ROOT, load_script

arch = load_script("check_architecture")

LEAVES = {"train.errors", "train.console", "train.paths", "train.compat", "launch.defaults", "launch.envnames",
          "core.errors", "core.limits", "core.safety", "core.homepath", "core.clicktypes", "core.runlayout",
          "core.installed"}
DOC = ROOT / "docs" / "architecture.md"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return arch.import_graph(ROOT)


def test_no_import_cycle(graph):
    assert arch.cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert arch.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert arch.cycles({"a": {"b"}, "b": set()}) == []


def test_leaves_import_only_leaves(graph):
    assert LEAVES <= set(graph)
    assert {leaf: graph[leaf] - LEAVES for leaf in LEAVES if graph[leaf] - LEAVES} == {}


def test_no_module_imports_an_aggregator_above_it(graph):
    mods = arch.module_files(ROOT)
    upward = [(m, t) for m, targets in graph.items() for t in targets
              if mods[t].name == "__init__.py" and m.startswith(t + ".")]
    assert upward == []
    assert "train.parallel" in graph["train.trainer"]  # the aggregator, imported from outside: fine


def _is_cli(module: str) -> bool:
    return module.rpartition(".")[2] in ("cli", "__main__")


def test_only_command_lines_import_command_lines(graph):
    def allowed(importer: str, cli: str) -> bool:
        if cli.endswith("__main__"):
            return False
        package = cli.rpartition(".")[0]
        return _is_cli(importer) and (package + ".").startswith(importer.rpartition(".")[0] + ".")

    bad = [(m, t) for m, targets in graph.items() for t in targets if _is_cli(t) and not allowed(m, t)]
    assert bad == []
    assert graph["train.cli"] >= {"train.doctor.cli", "train.bench.cli", "train.prepare.cli"}  # the rule bites


def test_the_model_knows_nothing_of_parallelism(graph):
    models = {m: t for m, t in graph.items() if m.startswith("train.models")}
    outside = {m: {x for x in t if not x.startswith("train.models")} - LEAVES for m, t in models.items()}
    assert models and {m: t for m, t in outside.items() if t} == {}


# What the rest of train may import from train.models: the seam, never a family's own modules.
MODEL_SEAM = {"train.models.registry", "train.models.spec", "train.models.presets", "train.models.weights"}


def test_the_rest_knows_models_only_through_their_spec(graph):
    """The trainer, parallel/, precision/, doctor and the rest ask a model's spec
    (``train.models.registry``) instead of importing a family (``train.models.llama``...)."""
    family = {m: {x for x in t if x.startswith("train.models.") and x not in MODEL_SEAM}
              for m, t in graph.items() if not m.startswith("train.models")}
    assert {m: t for m, t in family.items() if t} == {}
    assert {"train.models.llama", "train.models.gpt2.model"} <= set(graph)  # the rule has families to bite on


def test_launch_never_imports_torch_or_train():
    mods = arch.module_files(ROOT, ("launch",))
    bad = {m: arch.top_level_imports(m, p) & {"torch", "train"} for m, p in mods.items()}
    assert {m: names for m, names in bad.items() if names} == {}


def _package(module: str) -> str:
    return module.partition(".")[0]


def test_train_and_launch_stand_side_by_side_on_core(graph):
    """``core`` imports neither product; ``train`` and ``launch`` import each other never."""
    crossing = sorted((m, t) for m, targets in graph.items() for t in targets
                      if _package(m) != _package(t) and _package(t) != "core")
    assert crossing == []
    assert {t for m, ts in graph.items() if _package(m) == "train" for t in ts} >= {"core.safety", "core.catalog"}
    assert {t for m, ts in graph.items() if _package(m) == "launch" for t in ts} >= {"core.safety", "core.catalog"}


def test_core_never_imports_torch():
    mods = arch.module_files(ROOT, ("core",))
    bad = {m: arch.top_level_imports(m, p) & {"torch", "train", "launch"} for m, p in mods.items()}
    assert mods and {m: names for m, names in bad.items() if names} == {}


def test_no_file_over_800_lines_and_no_function_over_80():
    assert arch.EXCLUDED == ("tests/launch/golden/",)  # generated data only
    files = arch.source_files(ROOT, suffixes=arch.SOURCE_SUFFIXES)
    assert len(files) > 200
    assert [(p.relative_to(ROOT).as_posix(), n) for p, n in arch.long_files(files)] == []
    functions = arch.long_functions(arch.source_files(ROOT))
    assert [(p.relative_to(ROOT).as_posix(), name, n) for p, name, n in functions] == []


def test_no_test_module_imports_another():
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [(path.name, n) for n in names if n.rpartition(".")[2].startswith("test_")]
    assert bad == []


# --------------------------------------------------------------------------- docs/architecture.md


def _doc_paths(text: str) -> set[str]:
    return set(re.findall(r"`((?:core|train|launch)/[\w/.]*)`", text))


def test_architecture_doc_names_every_module_and_only_real_ones():
    text = DOC.read_text()
    named = _doc_paths(text)
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
    modules = {p.relative_to(ROOT).as_posix() for p in arch.module_files(ROOT).values()}
    empty = {m for m in modules if m.endswith("__init__.py") and not ast.parse((ROOT / m).read_text()).body}
    packages = {f"{p}__init__.py" for p in named if p.endswith("/")}  # `train/doctor/` names its __init__
    assert sorted(modules - empty - named - packages) == []


def test_architecture_doc_facts_name_real_definitions():
    """Each dotted ``module.name`` in the doc is a module with that top-level definition."""
    mods = arch.module_files(ROOT)
    refs = set(re.findall(r"`((?:core|train|launch)\.[\w.]+)`", DOC.read_text()))
    assert len(refs) >= 8
    missing = []
    for ref in sorted(refs):
        if ref in mods:
            continue
        module, _, name = ref.rpartition(".")
        if module not in mods or name not in _top_level_names(mods[module]):
            missing.append(ref)
    assert missing == []


def _top_level_names(path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_readme_links_the_architecture_doc():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
