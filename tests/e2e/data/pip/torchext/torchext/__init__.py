"""A torch C++ extension built against the installed torch."""

import torch  # noqa: F401  (loads libtorch for the extension)

from ._C import add_one, built_with_torch

__all__ = ["add_one", "built_with_torch"]
