"""A build hook context as cotainr (or the shim) hands it to cotainr-lumi."""

import os
from pathlib import Path
import types

from cotainr_lumi import _cotainr


def hook_context(*, image_path, system=None, base_image=None, options=None, **more):
    """A ``BuildContext`` of cotainr's (or the shim's) with these values."""
    fields = dict(
        image_path=Path(os.path.abspath(image_path)),
        base_image=base_image,
        system=system,
        conda_env_files=(),
        conda_prefix=None,
        conda_env_name=None,
        dry_run=True,
        options=types.MappingProxyType(dict(options or {})),
    )
    fields.update(more)
    return _cotainr.BuildContext(**fields)
