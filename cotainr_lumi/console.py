"""Console logging in the format of cotainr's CLI (for cotainr-lumi's own commands)."""

import logging
import sys


class _StandardStreamHandler(logging.StreamHandler):
    """A handler writing to the current ``sys.stdout``/``sys.stderr``."""

    def __init__(self, *, name, level, fmt):
        super().__init__(stream=getattr(sys, name))
        self._name = name
        self.setLevel(level)
        self.setFormatter(logging.Formatter(fmt))

    def emit(self, record):
        self.stream = getattr(sys, self._name)
        super().emit(record)


def setup_logging(*, verbosity=0):
    """
    Console handlers on the ``cotainr`` logger, as cotainr's CLI sets them.

    Parameters
    ----------
    verbosity : int
        cotainr's verbosity: -1 and below only critical messages, 2 and above
        debug messages.
    """
    level = logging.DEBUG if verbosity >= 2 else logging.INFO
    if verbosity <= -1:
        level = logging.CRITICAL
    out = _StandardStreamHandler(
        name="stdout", level=level, fmt="Cotainr:-: %(message)s"
    )
    out.addFilter(lambda record: record.levelno <= logging.INFO)
    err = _StandardStreamHandler(
        name="stderr",
        level=max(level, logging.WARNING),
        fmt="Cotainr:-:%(levelname)s: %(message)s",
    )
    root = logging.getLogger("cotainr")
    root.setLevel(level)
    root.handlers = [out, err]
