"""The package layout keeps its promises (docs/architecture.md).

Imports run downward only (front ends -> pipeline -> stages -> engine ->
_cotainr -> leaves), a stage's folder imports nothing from another stage's folder, only
``_cotainr`` imports cotainr, label names and image paths are spelled only in
``imagelayout.py`` and an ``apptainer exec`` command line only in
``apptainer.py``.
"""

import ast
from pathlib import Path
import re

import pytest

import cotainr_lumi

PACKAGE = Path(cotainr_lumi.__file__).parent

# Layer of each top-level entry; lower numbers are lower layers.
LAYERS = {
    "errors": 0,
    "_version": 0,
    "imagelayout": 0,
    "apptainer": 0,
    "safeio": 0,
    "processes": 0,
    "console": 0,
    "_cotainr": 1,
    "engine": 2,
    "stages": 3,
    "pipeline": 4,
    "verify": 5,
    "api": 5,
    "buildoptions": 5,
    "plugin": 5,
    "cli": 6,
    "__init__": 7,
    "__main__": 7,
}
# No exception: cotainr's entry point is the package-level plugin module, so
# no import runs back up from _cotainr.
ALLOWED_UPWARD = set()


def _module_name(path):
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path):
    """Yield (package-relative module imported, or 'cotainr...' absolute)."""
    name = _module_name(path)
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if name != "__init__" else []
    if not is_pkg:
        base = base[:-1]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.split(".")[0] == "cotainr":
                    yield node.module
                continue
            anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = [*anchor, *(node.module.split(".") if node.module else [])]
            if node.module is None:
                for alias in node.names:
                    yield ".".join([*target, alias.name])
            else:
                yield ".".join(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cotainr":
                    yield alias.name


def _all_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield _module_name(path), list(_imports(path))


def _layer(module):
    return LAYERS[module.split(".")[0]]


def _stage_folder(module):
    parts = module.split(".")
    if parts[0] == "stages" and len(parts) > 1:
        return parts[1]
    return None


IMPORTS = list(_all_imports())


def test_the_layout_is_found():
    names = {name for name, _ in IMPORTS}
    assert {"engine.stage", "stages.pip.stage", "stages.prune.stage"} <= names
    assert "stages.lumi_env.stage" in names and "_cotainr" in names
    assert {"pipeline.plan", "pipeline.profiles", "pipeline.build"} <= names


@pytest.mark.parametrize("module,imports", IMPORTS, ids=[n for n, _ in IMPORTS])
def test_imports_run_downward(module, imports):
    upward = [
        target
        for target in imports
        if not target.startswith("cotainr")
        and target.split(".")[0] in LAYERS
        and _layer(target) > _layer(module)
        and (module, target.split(".")[0]) not in ALLOWED_UPWARD
    ]
    assert upward == [], f"{module} imports a higher layer: {upward}"


STAGE_IMPORTS = [(n, i) for n, i in IMPORTS if _stage_folder(n)]


@pytest.mark.parametrize(
    "module,imports", STAGE_IMPORTS, ids=[n for n, _ in STAGE_IMPORTS]
)
def test_stage_folders_do_not_import_each_other(module, imports):
    own = _stage_folder(module)
    others = [t for t in imports if _stage_folder(t) not in (None, own)]
    assert others == [], f"{module} imports another stage's folder: {others}"


def test_only_the_seam_imports_cotainr():
    importers = sorted(
        module
        for module, imports in IMPORTS
        if any(t.split(".")[0] == "cotainr" for t in imports)
    )
    assert importers and all(m.split(".")[0] == "_cotainr" for m in importers), (
        importers
    )


# -- One place for the image layout and for `apptainer exec` -----------------

#: A label name cotainr-lumi sets (the whole string, as a label key is).
LABEL_NAME_RE = re.compile(r"cotainr-lumi\.[a-z0-9][a-z0-9.-]*")
#: The image paths cotainr-lumi writes or reads, spelled in imagelayout.py.
IMAGE_PATH_ROOTS = (
    "/opt/cotainr-lumi",
    "/runscripts",
    "/.singularity.d",
    "/user-software",
)


def _layout_spellings(path):
    """Yield (kind, line, text) of each label, image path or exec spelled here."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if LABEL_NAME_RE.fullmatch(node.value):
                yield "label", node.lineno, node.value
            elif node.value.startswith(IMAGE_PATH_ROOTS):
                yield "path", node.lineno, node.value
        elif isinstance(node, (ast.List, ast.Tuple)):
            if any(
                isinstance(e, ast.Constant) and e.value == "exec" for e in node.elts
            ):
                yield "exec", node.lineno, "[..., 'exec', ...]"
        elif isinstance(node, ast.Call):
            func = node.func
            name = getattr(func, "attr", None) or getattr(func, "id", None)
            if name == "which" and any(
                isinstance(a, ast.Constant) and a.value in ("apptainer", "singularity")
                for a in node.args
            ):
                yield "exec", node.lineno, f"which({node.args[0].value!r})"


SPELLINGS = {
    _module_name(path): list(_layout_spellings(path))
    for path in sorted(PACKAGE.rglob("*.py"))
    if _module_name(path) not in ("imagelayout", "apptainer")
}


@pytest.mark.parametrize("module", sorted(SPELLINGS))
def test_labels_paths_and_exec_are_spelled_in_one_place(module):
    found = list(SPELLINGS[module])
    assert found == [], (
        f"{module} spells {found}: take label names and image paths from "
        "cotainr_lumi.imagelayout, the exec command line from cotainr_lumi.apptainer"
    )


def test_the_layout_checks_find_what_they_look_for(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import shutil\n"
        '"""Docs may name cotainr-lumi.system and /runscripts."""\n'
        'LABELS = {"cotainr-lumi.system": "x", "name": f"cotainr-lumi.{1}"}\n'
        'FILE = "/opt/cotainr-lumi/x.json"\n'
        'CMD = ["singularity", "exec", "x.sif"]\n'
        'RUNTIME = shutil.which("apptainer")\n'
    )
    assert sorted((line, kind) for kind, line, _ in _layout_spellings(source)) == [
        (3, "label"),
        (4, "path"),
        (5, "exec"),
        (6, "exec"),
    ]


def test_the_leaf_modules_import_nothing_of_the_package():
    for leaf in ("imagelayout", "_version", "safeio"):
        imports = dict(IMPORTS)[leaf]
        assert imports == [], f"{leaf} imports {imports}"
    assert sorted(dict(IMPORTS)["apptainer"]) == ["errors", "safeio"]
    assert dict(IMPORTS)["processes"] == ["errors"]
