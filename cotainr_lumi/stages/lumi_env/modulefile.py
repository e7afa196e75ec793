"""
The files written next to an image: an Lmod module file and a shell snippet.

Bind mounts cannot be baked into a SIF, so, like LUST's EasyBuild container
modules, a module file and an equivalent POSIX shell snippet set ``SIF``,
``SINGULARITY_BIND`` and the rest. Both are rendered from one list of
operations (:func:`module_ops`); both start with :data:`MARKER`, so the
pipeline never replaces a user's own file of the same name.
"""

from dataclasses import dataclass
import importlib.resources
import logging
import os
from pathlib import Path
import re
import shlex

from ..._version import __version__
from ...engine.rootfs import resolve_in_root
from ...engine.stage import OUTPUT_MARKER as MARKER
from ...imagelayout import RUNSCRIPTS_DIR, USER_SOFTWARE_DIR
from .envfile import check_text, printable, sh_op
from .imagefiles import RUNSCRIPTS, runscript_text

logger = logging.getLogger(f"cotainr.{__name__}")


def lua_quote(text):
    """A Lua string literal."""
    data = str(text).encode("utf-8")
    safe = (
        chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\{b:03d}" for b in data
    )
    return '"' + "".join(safe) + '"'


def validate_bind(bind):
    """Check one bind specification (``SRC[:DST[:OPTS]]``)."""
    return check_text(bind, what="a bind SRC[:DST[:OPTS]]", forbid=",")


def check_image_path(image):
    """Check that an image path can be written into a module file."""
    what = "the image path (no module file can be written for it)"
    return check_text(str(image), what=what, forbid="", spaces=True)


def var_name_of(name):
    """The ``SIF<NAME>`` suffix for a module name, as EasyBuild would make it."""
    var = re.sub(r"[^A-Z0-9]+", "_", str(name).upper()).strip("_")
    if not var or not var[0].isalpha():
        var = "IMAGE_" + var if var else "IMAGE"
    return var


def check_var_name(var):
    """Check a ``SIF<NAME>`` suffix."""
    if not isinstance(var, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", var):
        raise ValueError(
            f"must be upper case letters, digits and '_', starting with a letter "
            f"(got {var!r}), e.g. PYTORCH for SIFPYTORCH"
        )
    return var


def _help_text(*, image, var, root):
    text = (
        f"cotainr-lumi container image {image}\n\n"
        f"Sets SIF and SIF{var} (the image), SINGULARITY_BIND (the LUMI host paths\n"
        f"the image needs), SINGULARITYENV_PREPEND_PATH ({RUNSCRIPTS_DIR} first in the\n"
        "container)"
    )
    if root:
        text += (
            f", CONTAINERROOT ({root}), RUNSCRIPTS (host copies of the\n"
            "runscripts) and puts start-shell, list-packages, make-squashfs and\n"
            "unmake-squashfs on PATH, and wrappers of the image's python, pip, torchrun, ...\n"
            "(those its env has), which run these in the container with the same\n"
            "arguments.\n"
            "$CONTAINERROOT/user-software (or user-software.squashfs, after\n"
            f"make-squashfs) is mounted at {USER_SOFTWARE_DIR}; a venv there is active in\n"
            f"the container (source {RUNSCRIPTS_DIR}/init-conda-venv creates it)"
        )
    return (
        text
        + '. Run with e.g.\n  srun singularity exec "$SIF" conda-python-distributed train.py\n'
    )


def _bind(value):
    return ("append_path", "SINGULARITY_BIND", value, ",")


def module_ops(
    *,
    image,
    binds,
    runscripts=RUNSCRIPTS_DIR,
    name=None,
    var=None,
    container_root=None,
    user_software=True,
    base=None,
):
    """The module file's and snippet's operations (`base`: the image is its layer)."""
    image = check_image_path(image)
    sif = check_image_path(base.path) if base else image
    binds = [validate_bind(b) for b in binds]
    name = name or Path(image).stem
    var = check_var_name(var or var_name_of(name))
    root = check_image_path(container_root) if container_root else None
    ops = [
        ("comment", f"File {MARKER} {__version__} for {image}."),
        ("comment", "Rewritten when the image is rebuilt; copy it before editing."),
        ("comment", f"Use: module load {name}, or source {name}.sh."),
        ("help", _help_text(image=image, var=var, root=root)),
        ("whatis", f"Name: {name}"),
        ("whatis", f"Description: cotainr-lumi container image {image}"),
        *_same_base(base, image),
        ("setenv", "SIF", sif),
        ("setenv", f"SIF{var}", sif),
    ]
    if base:  # the runtimes read these as --overlay
        ro = f"{image}:ro"  # (squashfs: read-only, without a warning)
        ops += [("setenv", f"{v}_OVERLAY", ro) for v in ("APPTAINER", "SINGULARITY")]
    if runscripts:
        ops.append(("prepend_path", "SINGULARITYENV_PREPEND_PATH", runscripts, ":"))
    if root:
        sub = {n: f"{root}/{n}" for n in ("bin", "runscripts", "user-software")}
        ops += [
            ("setenv", "CONTAINERROOT", root),
            ("setenv", f"EBROOT{var}", root),
            ("prepend_path", "PATH", sub["bin"], ":"),
        ]
        if runscripts:
            names = ("RUNSCRIPTS", f"RUNSCRIPTS{var}")
            ops += [("setenv", v, sub["runscripts"]) for v in names]
        if user_software:
            home = sub["user-software"]
            squashfs = _bind(f"{home}.squashfs:{USER_SOFTWARE_DIR}:image-src=/")
            branches = [
                ("file", f"{home}.squashfs", [squashfs]),
                ("dir", home, [_bind(f"{home}:{USER_SOFTWARE_DIR}")]),
            ]
            ops.append(("if", branches))
    elif runscripts:
        ops.append(("setenv", "RUNSCRIPTS", runscripts))
    return ops + [_bind(b) for b in binds]


LUA_OPS = {
    "help": "help({0})",
    "whatis": "whatis({0})",
    "setenv": "setenv({0}, {1})",
    "pushenv": "pushenv({0}, {1})",
    "prepend_path": "prepend_path({0}, {1}, {2})",
    "append_path": "append_path({0}, {1}, {2})",
    # Host discovery (mpi.discovery_command) on load; unload unsets its values.
    "discover": """local cl = {{libmpi = os.getenv({2}), path = os.getenv({3})}}
if mode() == "load" then
    cl = {{}}
    for k, v in capture({0}):gmatch("(%a+) ([^\\n]*)") do cl[k] = v end
    if cl[{1}] then LmodMessage(cl[{1}]) end
end
if cl.libmpi then setenv({2}, cl.libmpi) end
if cl.path then setenv({3}, cl.path) end""",
    "file": "isFile({0})",
    "dir": "isDir({0})",
    "same_base": 'if mode() == "load" and capture({3}) ~= {1} .. "\\n" then '
    "LmodError({2}) end",
}


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


def _same_base(base, layer):
    """The operation stopping a module of a layer on another base ([]: no base)."""
    if not base:
        return []
    return [("same_base", base.path, base.stamp, *base.check(layer))]


def lua_op(kind, *args):
    """One operation in Lmod's Lua, every argument quoted."""
    if kind.endswith("_path") and args[1].endswith("/"):
        # Lmod drops a final "/" from path entries: "//" keeps one.
        args = (args[0], args[1] + "/", *args[2:])
    return LUA_OPS[kind].format(*map(lua_quote, args))


#: Per language: an operation, a comment, if, else-if, end of if.
_LANGUAGES = {
    "lua": (lua_op, "--", "if {} then", "elseif {} then", "end"),
    "sh": (sh_op, "#", "if {}; then", "elif {}; then", "fi"),
}


def _lines(ops, *, language, indent=""):
    op, comment, first, other, end = _LANGUAGES[language]
    lines = []
    for kind, *args in ops:
        if kind == "if":
            for i, (test, path, then) in enumerate(args[0]):
                lines.append(indent + (other if i else first).format(op(test, path)))
                lines += _lines(then, language=language, indent=indent + "    ")
            lines.append(indent + end)
        elif kind == "comment":
            lines.append(f"{indent}{comment} {printable(args[0])}")
        elif (line := op(kind, *args)) is not None:
            lines.append(indent + line)
    return lines


def render(ops, *, language):
    """The module file (``lua``) or shell snippet (``sh``, to source) of `ops`."""
    return "\n".join(_lines(ops, language=language)) + "\n"


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
    *, settings, image_path, binds, user_software, mpi, wrappers, base=None
):
    """The module file, shell snippet and CONTAINERROOT files (host outputs)."""
    names = settings.names(image_path=image_path)
    if names.lua is None:
        return None, None, {}
    try:
        check_image_path(image_path)
    except ValueError as e:
        logger.warning("Not writing a module file: %s", e)
        return None, None, {}
    ops = module_ops(
        image=image_path,
        binds=binds,
        runscripts=RUNSCRIPTS_DIR if settings.runscripts else None,
        name=names.name,
        var=names.var,
        container_root=names.root,
        user_software=user_software,
        base=base,
    ) + mpi.module_ops(image=str(image_path))
    outputs = {
        str(names.lua): render(ops, language="lua"),
        str(names.shell): render(ops, language="sh"),
        **_container_root_files(
            settings=settings,
            root=names.root,
            image_path=image_path,
            user_venv=names.user_venv,
            wrappers=wrappers,
            base=base,
        ),
    }
    return (names.lua, names.shell), names.root, outputs


def _container_root_files(*, settings, root, image_path, user_venv, wrappers, base):
    """CONTAINERROOT's files: host commands, runscripts, user-software."""
    scripts = {**{n: n for n in HOST_COMMANDS}, **dict.fromkeys(wrappers, "python")}
    files = {
        str(root / "bin" / n): _host_command_text(
            s, image=image_path, root=root, base=base
        )
        for n, s in scripts.items()
    }
    if settings.runscripts:
        for name in RUNSCRIPTS:  # with the output marker after the first line
            first, _, rest = runscript_text(name).partition("\n")
            what = f"Host copy of {RUNSCRIPTS_DIR}/{name} (edit a copy), {MARKER}"
            files[str(root / "runscripts" / name)] = (
                f"{first}\n# {what} {__version__}.\n{rest}"
            )
    files[str(root / "user-software" / "README.cotainr-lumi")] = (
        f"{MARKER} {__version__} for {image_path}.\n"
        f"This directory is mounted at {USER_SOFTWARE_DIR} by the module.\n"
        f"In the container, `source /runscripts/init-conda-venv` creates and\n"
        f"activates the venv {user_venv} on top of the image's Python\n"
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
