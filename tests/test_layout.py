"""The package layout keeps its promises (docs/architecture.md).

Imports run downward only (front ends -> stages -> engine -> _cotainr ->
errors), a stage's folder imports nothing from another stage's folder, and
only ``_cotainr`` imports cotainr.
"""

import ast
from pathlib import Path

import pytest

import cotainr_lumi

PACKAGE = Path(cotainr_lumi.__file__).parent

# Layer of each top-level entry; lower numbers are lower layers.
LAYERS = {
    "errors": 0,
    "_version": 0,
    "imagelayout": 0,
    "apptainer": 0,
    "_cotainr": 1,
    "engine": 2,
    "stages": 3,
    "verify": 4,
    "api": 4,
    "buildoptions": 4,
    "plugin": 4,
    "cli": 5,
    "__init__": 6,
    "__main__": 6,
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
