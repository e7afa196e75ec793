"""The types of the build hook API (``docs/upstream/seam-api.md``), for the shim."""

from dataclasses import dataclass
from pathlib import Path
import signal
import types
from typing import Optional

HOOK_API_VERSION = 1


@dataclass(frozen=True)
class BuildContext:
    """What a build hook sees of a build (read only)."""

    image_path: Path
    base_image: str
    system: Optional[str]
    conda_env_files: tuple
    conda_prefix: Optional[str]
    conda_env_name: Optional[str]
    dry_run: bool
    options: types.MappingProxyType


class PluginError(Exception):
    """A plugin's one clear error: printed without a traceback, then exit."""

    def __init__(self, message, *, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class BuildInterruptedError(BaseException):
    """The build was stopped by a signal (a ``BaseException``, as Ctrl-C's)."""

    def __init__(self, signum):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(
            f"the build was interrupted by {signal.Signals(signum).name}; no image "
            "was written (an existing image is kept) and the build's sandbox and "
            "partial files were removed"
        )
