"""What the lumi-env stage writes next to the image: module file, shell snippet, CONTAINERROOT."""

import importlib.resources
import logging
import shlex

from ..._version import __version__
from ...engine.rootfs import resolve_in_root
from .imagefiles import RUNSCRIPTS, RUNSCRIPTS_DIR, runscript_text
from .modulefile import MARKER, check_image_path, module_ops, render
from .settings import USER_SOFTWARE

logger = logging.getLogger(f"cotainr.{__name__}")

#: The host commands in ``$CONTAINERROOT/bin`` (``cotainr_lumi/.../hostscripts/``).
HOST_COMMANDS = ("make-squashfs", "unmake-squashfs", "start-shell")


def _host_copy(text, *, what):
    """`text` (a script) with the output marker after its first line."""
    first, _, rest = text.partition("\n")
    return f"{first}\n# {what}, {MARKER} {__version__}.\n{rest}"


def _host_command_text(name, *, image, root):
    """A host command of ``$CONTAINERROOT/bin`` for this image."""
    body = (importlib.resources.files(__package__) / "hostscripts" / name).read_text()
    return (
        f"#!/bin/bash\n# {name}: {MARKER} {__version__} for {image}.\n"
        f"default_sif={shlex.quote(str(image))}\n"
        f"default_root={shlex.quote(str(root))}\n{body}"
    )


def module_outputs(*, settings, image_path, binds, user_venv, user_software, mpi):
    """The module file, shell snippet and CONTAINERROOT files (host outputs)."""
    names = settings.names(image_path=image_path)
    paths = (names.lua, names.shell) if names.lua is not None else None
    if paths is not None:
        try:
            check_image_path(image_path)
        except ValueError as e:
            logger.warning("Not writing a module file: %s", e)
            paths = None
    if paths is None:
        return None, None, {}
    container_root = names.root
    ops = module_ops(
        image=image_path,
        binds=binds,
        runscripts=RUNSCRIPTS_DIR if settings.runscripts else None,
        name=names.name,
        var=names.var,
        container_root=container_root,
        user_software=user_software,
    ) + mpi.module_ops(image=str(image_path))
    outputs = {
        str(paths[0]): render(ops, language="lua"),
        str(paths[1]): render(ops, language="sh"),
    }
    outputs.update(
        _container_root_files(
            settings=settings,
            root=container_root,
            image_path=image_path,
            user_venv=user_venv,
        )
    )
    return paths, container_root, outputs


def _container_root_files(*, settings, root, image_path, user_venv):
    """CONTAINERROOT's files: host commands, runscripts, user-software."""
    files = {
        str(root / "bin" / name): _host_command_text(name, image=image_path, root=root)
        for name in HOST_COMMANDS
    }
    if settings.runscripts:
        for name in RUNSCRIPTS:
            files[str(root / "runscripts" / name)] = _host_copy(
                runscript_text(name),
                what=f"Host copy of {RUNSCRIPTS_DIR}/{name} (edit a copy)",
            )
    files[str(root / "user-software" / "README.cotainr-lumi")] = (
        f"{MARKER} {__version__} for {image_path}.\n"
        f"This directory is mounted at {USER_SOFTWARE} by the module.\n"
        f"In the container, `source /runscripts/init-conda-venv` creates and\n"
        f"activates the venv {user_venv} on top of the image's Python\n"
        "environment; `pip install` then installs here. `make-squashfs` packs\n"
        "this directory into ../user-software.squashfs (reload the module).\n"
    )
    return files


def image_has_user_software(*, root):
    """Whether the image itself has content in /user-software."""
    path = resolve_in_root(root=root, path=USER_SOFTWARE)
    if path.is_dir() and any(path.iterdir()):
        logger.warning(
            "The image has its own %s (e.g. the base image's venv); the "
            "module will not mount $CONTAINERROOT/user-software over it, so "
            "the user-software workflow (init-conda-venv, make-squashfs) is "
            "off for this image. Install more packages with a pip step instead.",
            USER_SOFTWARE,
        )
        return True
    return False
