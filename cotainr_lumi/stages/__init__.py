"""
The built-in stages of cotainr-lumi.

Importing this package imports every module in it; each module registers its
stage(s) with :func:`cotainr_lumi.engine.stage.register_stage`.
"""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
