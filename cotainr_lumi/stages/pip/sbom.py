"""
The image's SBOMs: what the target env holds and what this build added.

Two records, both written after the pip steps from the env's ``pip list``:

- a CycloneDX JSON SBOM of the target env's Python packages
  (:data:`cotainr_lumi.imagelayout.CYCLONEDX_SBOM_FILE`, label
  ``cotainr-lumi.sbom``), made with ``cyclonedx-python-lib``: one ``library``
  component per distribution with its ``pkg:pypi`` purl and the property
  ``cotainr-lumi:origin`` (``base``: in the base image as it is, ``build``:
  installed or changed by this build's pip steps); the image is the
  ``container`` component the packages belong to;
- the LUMI AI Factory images' own SBOM ``/.sbom.json`` (``{"apt": [...],
  "pip": [pip list --format=json]}``, written by their recipes), kept in its
  format with its ``pip`` list replaced by the env's new one; ``apt`` is
  left as it is (a build adds no apt packages). Images without one get none.
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


def _origin(package, base_packages):
    if base_packages is None:
        return "base"
    key = canonicalize_name(package["name"])
    return "base" if base_packages.get(key) == package["version"] else "build"


def _normalised(packages):
    return {canonicalize_name(p["name"]): p["version"] for p in packages or []}


def _image_component(*, image_name, target_prefix, base_image):
    """The image: the ``container`` component the packages belong to."""
    properties = [Property(name="cotainr-lumi:target-env", value=target_prefix)]
    if base_image:
        properties.append(
            Property(name="cotainr-lumi:base-image", value=str(base_image))
        )
    return Component(
        name=image_name,
        type=ComponentType.CONTAINER,
        bom_ref=f"image:{image_name}",
        properties=properties,
    )


def _package_component(package, *, before):
    """One distribution: a ``library`` component with its purl and origin."""
    purl = PackageURL(type="pypi", name=package["name"], version=package["version"])
    return Component(
        name=package["name"],
        version=package["version"],
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=purl.to_string(),
        properties=[Property(name=ORIGIN_PROPERTY, value=_origin(package, before))],
    )


def cyclonedx_json(
    *, image_name, packages, base_packages, target_prefix, base_image=None
):
    """The CycloneDX JSON SBOM of the target env."""
    before = None if base_packages is None else _normalised(base_packages)
    bom = Bom()
    image = _image_component(
        image_name=image_name, target_prefix=target_prefix, base_image=base_image
    )
    bom.metadata.component = image
    bom.metadata.tools.components.add(
        Component(
            name="cotainr-lumi", version=__version__, type=ComponentType.APPLICATION
        )
    )
    components = [
        _package_component(package, before=before)
        for package in sorted(packages, key=lambda p: p["name"].lower())
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
    write_file_in_root(
        root=root,
        path=imagelayout.AIF_SBOM_FILE,
        content=json.dumps(sbom, indent=2) + "\n",
        mode=0o644,
    )
    return True


def write_sboms(
    *, root, image_name, packages, base_packages, target_prefix, base_image=None
):
    """Write both SBOMs."""
    write_file_in_root(
        root=root,
        path=imagelayout.CYCLONEDX_SBOM_FILE,
        content=cyclonedx_json(
            image_name=image_name,
            packages=packages,
            base_packages=base_packages,
            target_prefix=target_prefix,
            base_image=base_image,
        ),
        mode=0o644,
    )
    aif = update_aif_sbom(root=root, packages=packages)
    before = None if base_packages is None else _normalised(base_packages)
    added = sorted(p["name"] for p in packages if _origin(p, before) == "build")
    return {
        "cyclonedx": imagelayout.CYCLONEDX_SBOM_FILE,
        "aif": imagelayout.AIF_SBOM_FILE if aif else None,
        "added": added,
    }
