"""
The image's SBOMs, written after the pip steps from the env's ``pip list``.

- CycloneDX JSON (:data:`cotainr_lumi.imagelayout.CYCLONEDX_SBOM_FILE`): the
  image is the ``container`` component; each distribution a ``library`` with
  its ``pkg:pypi`` purl and :data:`ORIGIN_PROPERTY` ``base`` (as in the base
  image) or ``build`` (installed or changed by this build); the distribution
  packages the system-packages stage added or changed (its record), ``build``;
- the LUMI AI Factory images' own ``/.sbom.json`` (``{"apt": [...], "pip":
  [...]}``), kept in its format with its ``pip`` list replaced, if the base
  image has one.
"""

import json
import logging

from cyclonedx.model import Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output import OutputFormat, make_outputter
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL
from packaging.utils import canonicalize_name

from ... import imagelayout
from ..._version import __version__
from ...engine.rootfs import resolve_in_root, write_file_in_root

logger = logging.getLogger(f"cotainr.{__name__}")

#: The CycloneDX specification version written.
SCHEMA_VERSION = SchemaVersion.V1_6
#: The component property saying where a package comes from.
ORIGIN_PROPERTY = "cotainr-lumi:origin"


def _added(packages, base_packages):
    """The names of the packages not as in the base (none without a base list)."""
    if base_packages is None:
        return set()
    base = {canonicalize_name(p["name"]): p["version"] for p in base_packages}
    return {
        p["name"]
        for p in packages
        if base.get(canonicalize_name(p["name"])) != p["version"]
    }


def _library(package, origin, **purl):
    """The component of a package with its purl and :data:`ORIGIN_PROPERTY`."""
    name = package["name"]
    version = package["version"]
    purl = PackageURL(name=name, version=version, **purl)
    return Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=purl.to_string(),
        properties=[Property(name=ORIGIN_PROPERTY, value=origin)],
    )


def read_system_record(*, root):
    """The system-packages stage's record of this build ({} without one)."""
    path = resolve_in_root(root=root, path=imagelayout.SYSTEM_PACKAGES_FILE)
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        record = {}
    return record if isinstance(record, dict) else {}


def cyclonedx_json(
    *,
    image_name,
    packages,
    base_packages,
    target_prefix,
    base_image=None,
    system_record=None,
):
    """The CycloneDX JSON SBOM of the target env."""
    properties = [Property(name="cotainr-lumi:target-env", value=target_prefix)]
    if base_image:
        properties.append(
            Property(name="cotainr-lumi:base-image", value=str(base_image))
        )
    image = Component(
        name=image_name,
        type=ComponentType.CONTAINER,
        bom_ref=f"image:{image_name}",
        properties=properties,
    )
    bom = Bom()
    bom.metadata.component = image
    bom.metadata.tools.components.add(
        Component(
            name="cotainr-lumi", version=__version__, type=ComponentType.APPLICATION
        )
    )
    added = _added(packages, base_packages)
    components = [
        _library(p, "build" if p["name"] in added else "base", type="pypi")
        for p in sorted(packages, key=lambda p: p["name"].lower())
    ]
    system = system_record or {}
    components += [  # what the system-packages stage added or changed
        _library(
            p,
            "build",
            type=system["kind"],
            namespace=system["distro"],
            qualifiers={"arch": p["arch"]},
        )
        for p in system.get("added", []) + system.get("changed", [])
    ]
    for component in components:
        bom.components.add(component)
    bom.register_dependency(image, components)
    return make_outputter(bom, OutputFormat.JSON, SCHEMA_VERSION).output_as_string(
        indent=2
    )


def update_aif_sbom(*, root, packages):
    """Replace the ``pip`` list of the base's ``/.sbom.json`` (AI Factory format)."""
    path = resolve_in_root(root=root, path=imagelayout.AIF_SBOM_FILE)
    if not path.is_file():
        return False
    try:
        sbom = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        logger.warning(
            "Leaving %s alone: it is not JSON (%s).", imagelayout.AIF_SBOM_FILE, e
        )
        return False
    if not isinstance(sbom, dict) or not {"apt", "pip"} & set(sbom):
        logger.warning(
            "Leaving %s alone: it is not the LUMI AI Factory format "
            '({"apt": [...], "pip": [...]}).',
            imagelayout.AIF_SBOM_FILE,
        )
        return False
    sbom["pip"] = [{"name": p["name"], "version": p["version"]} for p in packages]
    text = json.dumps(sbom, indent=2) + "\n"
    write_file_in_root(root=root, path=imagelayout.AIF_SBOM_FILE, content=text)
    return True


def write_sboms(*, root, packages, base_packages, **image):
    """Write both SBOMs (`image`: the rest of :func:`cyclonedx_json`'s arguments)."""
    system_record = read_system_record(root=root)
    text = cyclonedx_json(
        packages=packages,
        base_packages=base_packages,
        system_record=system_record,
        **image,
    )
    write_file_in_root(root=root, path=imagelayout.CYCLONEDX_SBOM_FILE, content=text)
    aif = update_aif_sbom(root=root, packages=packages)
    added = sorted(_added(packages, base_packages))
    aif = imagelayout.AIF_SBOM_FILE if aif else None
    logger.info(
        "SBOM: %s%s; added by this build: %s",
        imagelayout.CYCLONEDX_SBOM_FILE,
        f" and {aif}" if aif else "",
        ", ".join(added) or "nothing",
    )
    return {"cyclonedx": imagelayout.CYCLONEDX_SBOM_FILE, "aif": aif, "added": added}
