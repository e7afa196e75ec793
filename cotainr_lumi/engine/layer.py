"""Layered builds (issue 30): the base SIF mounted under a writable dir, which becomes a layer."""

import contextlib
import json
import logging
import os
from pathlib import Path
import re
import shlex
import shutil
import subprocess

from .. import apptainer, safeio
from ..errors import InputError
from ..imagelayout import LABEL_LAYERS, LABELS_FILE
from .digest import Pinned, sha256_of_file
from .rootfs import resolve_in_root
from .sifimage import GZIP, METADATA_NAME, last_line, squash_command

logger = logging.getLogger(f"cotainr.{__name__}")

#: fuse-overlayfs writes a whiteout as an empty file with this prefix where it
#: cannot mknod, and refuses such names from users (EINVAL; its main.c,
#: create_whiteout and ovl_lookup, v1.10). The kernel's overlay writes a
#: character device 0/0 (and lets a package ship a ``.wh.`` file).
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
#: This build's layer in the label :data:`LABEL_LAYERS` (its sha256 in the SIF's).
THIS = "this build"


class LayerError(Exception):
    """The base cannot be mounted here (unpacked, unless it has layers)."""


def refusal(image, problem):
    """The error for a base with layers that is not mounted (unpacking drops them)."""
    return InputError(
        f"The base image {image} has layers (SIF overlay partitions), which "
        f"unpacking it would leave out; it is not mounted here ({problem}): "
        "squash it whole first where it mounts (--flatten, without --conda-env) "
        "and build on that."
    )


def _partitions(objects):
    """A base's overlay partitions, newest first, then its system partition."""
    parts = [o for o in objects if o.datatype == apptainer.SIF_PARTITION]
    system = [p for p in parts if p.parttype == apptainer.SIF_SYSTEM]
    overlays = [p for p in parts if p.parttype == apptainer.SIF_OVERLAY]
    if len(system) != 1 or any(p.fstype != apptainer.SIF_SQUASHFS for p in parts):
        raise LayerError("its partitions are not squashfs (one system, overlays)")
    return sorted(overlays, key=lambda p: -p.id) + system


def overlays(image):
    """The number of overlay partitions of a SIF (0: none, or not a SIF)."""
    try:
        objects = apptainer.sif_objects(image)
    except (OSError, ValueError):
        return 0
    return sum(o.parttype == apptainer.SIF_OVERLAY for o in objects)


def mount_problem(image):
    """Why `image` cannot be mounted as a build's base here (None: it can)."""
    fuse = ("squashfuse", "fuse-overlayfs")
    if os.geteuid() != 0 and not all(map(shutil.which, fuse)):
        return "not root, and squashfuse and fuse-overlayfs are not both on PATH"
    try:
        _partitions(apptainer.sif_objects(image))
    except (OSError, ValueError, LayerError) as e:
        return f"the base image cannot be mounted: {e}"
    return None


def unmount(path):
    """Unmount `path`, lazily (a process still in it does not keep it)."""
    fusermount = shutil.which("fusermount3") or "fusermount"
    cmd = ["umount", "-l"] if os.geteuid() == 0 else [fusermount, "-u", "-z"]
    done = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    if done.returncode:
        logger.warning("Could not unmount %s: %s", path, done.stderr.strip())


def unmount_below(directory):
    """Unmount what a killed build left mounted in `directory`, deepest first."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = os.path.realpath(directory) + "/"
    points = [line.split()[1].replace("\\040", " ") for line in lines]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        unmount(point)


def whiteout_arguments(upper):
    """The mksquashfs arguments making fuse-overlayfs's ``.wh.`` files overlay whiteouts."""
    pseudo = []
    for directory, _dirs, files in os.walk(upper):
        inside = "/" + os.path.relpath(directory, upper).lstrip(".")
        for name in sorted(f for f in files if f.startswith(WHITEOUT)):
            if name == OPAQUE:
                pseudo += ["-p", f"{_escape(inside)} x trusted.overlay.opaque=y"]
            else:
                path = os.path.join(inside, name[len(WHITEOUT) :])
                pseudo += ["-p", f"{_escape(path)} c 0 0 0 0 0"]
    if not pseudo:
        return []
    return [*pseudo, "-wildcards", "-e", f"... {WHITEOUT}*"]  # -e takes all after it


def _escape(path):
    return re.sub(r'([\\\s"])', r"\\\1", path)


def _run(cmd):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode:
        why = last_line(done.stderr or done.stdout)
        raise LayerError(f"{shlex.join(map(str, cmd[:3]))}...: {why}")


class BaseView:
    """A base SIF, read through `pinned`, mounted under a writable dir in `work`."""

    def __init__(
        self, *, base, work, pinned=None, layer=True, only=False, compression=GZIP
    ):
        self.base = Path(base)
        self.work = Path(work)
        self.layer = layer
        self.pinned = pinned or Pinned(base)
        self.source = self.pinned.path
        self.compression = compression
        self.only = only  # the layer alone, on the base
        self.kept = False
        self.upper = self.work / "upper"
        self.mounts = []
        self.merged = None
        self.objects = apptainer.sif_objects(self.source)
        self.meta, self.metadata = _metadata(self.source, self.objects)
        data = self.metadata.setdefault("data", {})
        self.attributes = data.setdefault("attributes", {})  # what inspect shows
        self.fuse = os.geteuid() != 0  # squashfuse and fuse-overlayfs
        self.layers = overlays(self.source)

    def mount(self, *, at):
        """Mount the view at `at` (an error or a signal: nothing left mounted)."""
        if not apptainer.can_bind(self.work):
            raise LayerError(f"the work dir {self.work} has a ',' or ':'")
        try:
            self._mount_view(at)
        except BaseException:
            self.unmount()
            raise
        self.merged = Path(at)
        logger.info("The base image is mounted read-only at %s (no unpack)", at)

    def _mount_view(self, at):
        fuse = self.fuse
        lowers = []
        for part in _partitions(self.objects):
            lowers.append(self.work / f"lower-{part.id}")
            lowers[-1].mkdir(parents=True)
            mount = ["squashfuse", "-o"] if fuse else ["mount", "-t", "squashfs", "-o"]
            where = "" if fuse else f"loop,ro,sizelimit={part.size},"
            self._mount(
                [*mount, f"{where}offset={part.offset}", self.source, lowers[-1]]
            )
        (self.work / "work").mkdir()
        self.upper.mkdir()
        options = "lowerdir={},upperdir={},workdir={}".format(
            ":".join(map(str, lowers)), self.upper, self.work / "work"
        )
        overlay = ["fuse-overlayfs"] if fuse else ["mount", "-t", "overlay", "overlay"]
        self._mount([*overlay, "-o", options, at])
        # Run as cotainr runs it (a setuid runtime may not see a user's FUSE mount).
        try:
            seen = apptainer.exec_in_image(
                image=at, args=["true"], writable=True, timeout=300
            )
        except subprocess.SubprocessError as e:
            seen = subprocess.CompletedProcess(e.cmd, -1, "", str(e))
        if not seen.returncode:
            return
        why = last_line(seen.stderr)
        hint = apptainer.env_deadline_hint(
            seen.stderr, image=f"the base image {self.base}"
        )
        if hint:  # unpacked, the base would run the same env scripts again
            raise InputError(f"The base image {self.base} does not start: {why}.{hint}")
        raise LayerError(f"the runtime cannot run the mounted base: {why}")

    def refused(self, problem):
        """The error for this base when it cannot be mounted (it has layers)."""
        return refusal(self.base, problem)

    def _mount(self, cmd):
        self.mounts.append(cmd[-1])  # a signal may come once it is mounted
        try:
            _run(cmd)
        except (OSError, LayerError):
            self.mounts.pop()  # it failed: nothing mounted there
            raise

    def unmount(self):
        """Unmount everything :meth:`mount` mounted (again: nothing)."""
        while self.mounts:
            unmount(self.mounts.pop())

    def write_image(self, *, path):
        """Write the layered image to `path`; False (said why): build it whole."""
        if not self.layer:
            logger.info("--flatten: the whole image is squashed again.")
            return False
        try:
            labels = _read(resolve_in_root(root=self.merged, path=LABELS_FILE))
            image, overlay = self._write(Path(path), labels)
            cat = ["cat", LABELS_FILE]
            seen = apptainer.exec_in_image(image=image, args=cat, overlay=overlay)
            why = f"it shows no layer: {seen.stderr.strip()[-300:] or 'other labels'}"
            if seen.returncode == 0 and seen.stdout == labels:
                self.pinned.check()  # the same base at the end
                self.kept = True
                return True
        except (OSError, ValueError, subprocess.SubprocessError, LayerError) as e:
            why = str(e)
        finally:
            if not self.kept:
                Path(path).unlink(missing_ok=True)
        why = f"{apptainer.runtime()} here: {why}"
        logger.warning("Building the whole image (no layer): %s.", why)
        return False

    def _write(self, path, labels):
        """The base copied to `path` plus the layer (or it alone); what to run it as."""
        delta = self.work / "layer.sqfs"
        whiteouts = whiteout_arguments(self.upper) if self.fuse else []
        _run(
            squash_command(
                source=self.upper,
                dest=delta,
                compression=self.compression,
                extra=["-quiet", *whiteouts],
            )
        )
        size = delta.stat().st_size >> 10
        self.pinned.check()
        if self.only:  # as the module file runs it (a list of PATH[:ro])
            if not apptainer.can_bind(path):
                raise LayerError(f"{path} has a ',' or ':' (--overlay takes a list)")
            shutil.copy(delta, path)
            logger.info("The layer alone (%d KiB) for the base %s", size, self.base)
            return self.base, f"{path}:ro"  # (squashfs: read-only, without a warning)
        shutil.copyfile(self.source, path)
        arch = _partitions(self.objects)[-1].arch
        _run(apptainer.sif_add(image=path, file=delta, arch=arch))
        if self.meta:  # what `inspect` may show: this build's labels and env files
            self._update(delta, json.JSONDecoder().raw_decode(labels)[0])
            (self.work / METADATA_NAME).write_text(json.dumps(self.metadata))
            _run(apptainer.sif_delete(image=path, object_id=self.meta.id))
            _run(apptainer.sif_add(image=path, file=self.work / METADATA_NAME))
        logger.info("Layered image: %s plus a %d KiB layer", self.base.name, size)
        return path, None

    def label(self, *, sha256=None):
        """The label :data:`LABEL_LAYERS`: the base's layers, then this build."""
        base = self.base.name + (f" sha256:{sha256}" if sha256 else "")
        labels = self.attributes.get("labels") or {}
        return f"{labels.get(LABEL_LAYERS) or base} + {THIS}"

    def _update(self, delta, labels):
        layer = f"layer sha256:{sha256_of_file(path=delta)}"
        layers = labels.get(LABEL_LAYERS, THIS).replace(THIS, layer)
        self.attributes["labels"] = {**labels, LABEL_LAYERS: layers}
        environment = self.attributes.get("environment") or {}
        for name in environment:
            file = resolve_in_root(root=self.merged, path=name)
            environment[name] = _read(file) if file.is_file() else ""


def _read(path):
    """A text file of the image, bounded (OSError: not a regular file, or too large)."""
    return safeio.read_bounded(path).decode("utf-8", errors="replace")


def _metadata(image, objects):
    """The SIF object of what ``apptainer inspect`` may show, and its JSON."""
    meta = next((o for o in objects if o.datatype == apptainer.SIF_JSON), None)
    if meta is None or meta.size > safeio.MAX_RECORD_BYTES:
        return None, {}
    with open(image, "rb") as f, contextlib.suppress(ValueError):
        return meta, json.loads(os.pread(f.fileno(), meta.size, meta.offset))
    return None, {}
