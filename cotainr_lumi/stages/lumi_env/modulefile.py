"""
The files written next to an image: an Lmod module file and a shell snippet.

Bind mounts cannot be baked into a SIF, so, like LUST's EasyBuild container
modules, a module file and an equivalent POSIX shell snippet set ``SIF``,
``SINGULARITY_BIND`` and the rest. Both are rendered from one list of
operations (:func:`module_ops`, records of :mod:`.ops`); both start with :data:`MARKER`, so the
pipeline never replaces a user's own file of the same name.
"""

from dataclasses import dataclass
import importlib.resources
import logging
import os
import shlex

from ..._version import __version__
from ...engine.rootfs import resolve_in_root
from ...engine.stage import OUTPUT_MARKER as MARKER
from ...imagelayout import RUNSCRIPTS_DIR, USER_SOFTWARE_DIR
from .imagefiles import RUNSCRIPTS, runscript_text
from .ops import (
    Comment,
    Help,
    IfPath,
    PrependPath,
    SameBase,
    SetEnv,
    Whatis,
    bind,
    render,
)
from .validators import check_image_path

logger = logging.getLogger(f"cotainr.{__name__}")


def _help_text(*, image, var, root):
    return (
        f"cotainr-lumi container image {image}\n\n"
        f"Sets SIF and SIF{var} (the image), SINGULARITY_BIND (the LUMI host paths\n"
        f"the image needs), SINGULARITYENV_PREPEND_PATH ({RUNSCRIPTS_DIR} first in the\n"
        f"container), CONTAINERROOT ({root}), RUNSCRIPTS (host copies of the\n"
        "runscripts) and puts start-shell, list-packages, make-squashfs and\n"
        "unmake-squashfs on PATH, and wrappers of the image's python, pip, torchrun, ...\n"
        "(those its env has), which run these in the container with the same\n"
        "arguments.\n"
        "$CONTAINERROOT/user-software (or user-software.squashfs, after\n"
        f"make-squashfs) is mounted at {USER_SOFTWARE_DIR}; a venv there is active in\n"
        f"the container (source {RUNSCRIPTS_DIR}/init-conda-venv creates it). Run with "
        'e.g.\n  srun singularity exec "$SIF" conda-python-distributed train.py\n'
    )


def module_ops(
    *, image, binds, names, runscripts=RUNSCRIPTS_DIR, user_software=True, base=None
):
    """The module file's and snippet's operations (`base`: the image is its layer).

    `names`: the module's :class:`.settings.ModuleNames`; they and the binds
    are checked settings.
    """
    image = check_image_path(image)
    name = names.name
    var = names.var
    root = str(names.root)  # CONTAINERROOT: bin/, runscripts/, user-software
    ops = [
        Comment(f"File {MARKER} {__version__} for {image}."),
        Comment("Rewritten when the image is rebuilt; copy it before editing."),
        Comment(f"Use: module load {name}, or source {name}.sh."),
        Help(_help_text(image=image, var=var, root=root)),
        Whatis(f"Name: {name}"),
        Whatis(f"Description: cotainr-lumi container image {image}"),
    ]
    sif = image
    if base:  # the image is a layer: check its base, run that
        sif = check_image_path(base.path)
        ops.append(SameBase(base.path, base.stamp, *base.check(image)))
    ops += [SetEnv("SIF", sif), SetEnv(f"SIF{var}", sif)]
    if base:  # The runtimes read these as --overlay (squashfs: read-only, no warning).
        ops += [
            SetEnv(f"{v}_OVERLAY", f"{image}:ro") for v in ("APPTAINER", "SINGULARITY")
        ]
    if runscripts:
        ops.append(PrependPath("SINGULARITYENV_PREPEND_PATH", runscripts))
    ops += [
        SetEnv("CONTAINERROOT", root),
        SetEnv(f"EBROOT{var}", root),
        PrependPath("PATH", os.path.join(root, "bin")),
    ]
    if runscripts:
        copies = os.path.join(root, "runscripts")
        ops += [SetEnv(v, copies) for v in ("RUNSCRIPTS", f"RUNSCRIPTS{var}")]
    if user_software:
        home = os.path.join(root, "user-software")
        squashfs = bind(f"{home}.squashfs:{USER_SOFTWARE_DIR}:image-src=/")
        branches = (
            ("file", f"{home}.squashfs", [squashfs]),
            ("dir", home, [bind(f"{home}:{USER_SOFTWARE_DIR}")]),
        )
        ops.append(IfPath(branches))
    return ops + [bind(b) for b in binds]


@dataclass(frozen=True)
class LayerBase:
    """The base a ``--layer-only`` image runs on, and its ``stat -L -c '%s %Y'``."""

    path: str
    stamp: str

    @classmethod
    def of(cls, base_image):
        """The plan's base image as the build read it."""
        pinned = base_image.pinned
        info = os.stat(pinned.path if pinned else base_image.resolved)
        return cls(str(base_image.resolved), f"{info.st_size} {int(info.st_mtime)}")

    def check(self, layer):
        """(the message for another base, the shell command printing its stamp)."""
        message = (
            f"the base image {self.path} is not the one the layer {layer} was built "
            "on (its size or time changed); put that base back, or build the layer again"
        )
        return message, f"stat -L -c '%s %Y' -- {shlex.quote(self.path)} 2>/dev/null"


#: The host commands in ``$CONTAINERROOT/bin`` (``cotainr_lumi/.../hostscripts/``).
HOST_COMMANDS = ("make-squashfs", "unmake-squashfs", "start-shell", "list-packages")
#: Commands of the target env that get a copy of ``hostscripts/python``
#: (LUST's PyTorch modules' wrappers; X.Y: the env's Python version).
WRAPPED = (
    "python python3 pythonX.Y pip pip3 pipX.Y accelerate huggingface-cli ray torchrun"
)


def wrapper_names(*, root, target):
    """The commands of :data:`WRAPPED` in the target env's ``bin``."""
    if target is None:
        return []
    xy = ".".join(target.version.split(".")[:2])
    names = dict.fromkeys(n.replace("X.Y", xy) for n in WRAPPED.split())
    found = (resolve_in_root(root=root, path=f"{target.bin_dir}/{n}") for n in names)
    return [n for n, path in zip(names, found) if path.is_file()]


def _host_command_text(name, *, image, root, base=None):
    """A host command of ``$CONTAINERROOT/bin`` for this image (or layer on `base`)."""
    body = (importlib.resources.files(__package__) / "hostscripts" / name).read_text()
    sif = base.path if base else image
    head = [
        f"#!/bin/bash\n# {name}: {MARKER} {__version__} for {image}.",
        f"default_sif={shlex.quote(str(sif))}",
        f"default_root={shlex.quote(str(root))}",
    ]
    if base and name in ("python", "start-shell"):  # run the layer on its base
        message, stat = base.check(image)
        overlay = shlex.quote(f"{image}:ro")
        head += [
            'if [[ ${SIF:-$default_sif} == "$default_sif" ]]; then',
            f"    if [[ $({stat}) != {shlex.quote(base.stamp)} ]]; then",
            f"        printf '%s: %s\\n' \"${{0##*/}}\" {shlex.quote(message)} >&2",
            "        exit 2",
            "    fi",
            f"    export APPTAINER_OVERLAY={overlay} SINGULARITY_OVERLAY={overlay}",
            "fi",
        ]
    return "\n".join([*head, body])


def module_outputs(
    *, settings, names, image_path, binds, user_software, mpi, wrappers, base=None
):
    """{path: text} of the module file, shell snippet and CONTAINERROOT files.

    `names`: the image's :class:`.settings.ModuleNames`.
    """
    if names.lua is None:
        return {}
    try:
        check_image_path(image_path)
    except ValueError as e:
        logger.warning("Not writing a module file: %s", e)
        return {}
    ops = module_ops(
        image=image_path,
        binds=binds,
        runscripts=RUNSCRIPTS_DIR if settings.runscripts else None,
        names=names,
        user_software=user_software,
        base=base,
    ) + mpi.module_ops(image=str(image_path))
    root = names.root  # CONTAINERROOT: host commands, runscripts, user-software
    scripts = {**{n: n for n in HOST_COMMANDS}, **dict.fromkeys(wrappers, "python")}
    files = {
        names.lua: render(ops, language="lua"),
        names.shell: render(ops, language="sh"),
        **{
            root / "bin" / n: _host_command_text(
                s, image=image_path, root=root, base=base
            )
            for n, s in scripts.items()
        },
    }
    if settings.runscripts:
        for name in RUNSCRIPTS:  # with the output marker after the first line
            first, _, rest = runscript_text(name).partition("\n")
            what = f"Host copy of {RUNSCRIPTS_DIR}/{name} (edit a copy), {MARKER}"
            files[root / "runscripts" / name] = (
                f"{first}\n# {what} {__version__}.\n{rest}"
            )
    files[root / "user-software" / "README.cotainr-lumi"] = (
        f"{MARKER} {__version__} for {image_path}.\n"
        f"This directory is mounted at {USER_SOFTWARE_DIR} by the module.\n"
        f"In the container, `source /runscripts/init-conda-venv` creates and\n"
        f"activates the venv {names.user_venv} on top of the image's Python\n"
        "environment; `pip install` then installs here. `make-squashfs` packs\n"
        "this directory into ../user-software.squashfs (reload the module).\n"
    )
    return files


def image_has_user_software(*, root):
    """Whether the image itself has content in /user-software."""
    path = resolve_in_root(root=root, path=USER_SOFTWARE_DIR)
    if path.is_dir() and any(path.iterdir()):
        logger.warning(
            "The image has its own %s (e.g. the base image's venv); the "
            "module will not mount $CONTAINERROOT/user-software over it, so "
            "the user-software workflow (init-conda-venv, make-squashfs) is "
            "off for this image. Install more packages with a pip step instead.",
            USER_SOFTWARE_DIR,
        )
        return True
    return False
