"""Console logging in cotainr's CLI format."""

import logging

import pytest

from cotainr_lumi import console


@pytest.fixture
def cotainr_logger():
    logger = logging.getLogger("cotainr")
    saved = (logger.level, list(logger.handlers))
    yield logger
    logger.setLevel(saved[0])
    logger.handlers = saved[1]


def test_info_goes_to_stdout_and_warnings_to_stderr(cotainr_logger, capsys):
    console.setup_logging(verbosity=0)
    logging.getLogger("cotainr.x").info("building")
    logging.getLogger("cotainr.x").debug("detail")
    logging.getLogger("cotainr.x").warning("careful")
    out, err = capsys.readouterr()
    assert out == "Cotainr:-: building\n"
    assert err == "Cotainr:-:WARNING: careful\n"


@pytest.mark.parametrize(
    ("verbosity", "shown"),
    [
        (-1, ["CRITICAL"]),
        (0, ["INFO", "ERROR", "CRITICAL"]),
        (2, ["DEBUG", "INFO", "ERROR", "CRITICAL"]),
    ],
)
def test_verbosity_sets_what_is_shown(cotainr_logger, capsys, verbosity, shown):
    console.setup_logging(verbosity=verbosity)
    for level in ("DEBUG", "INFO", "ERROR", "CRITICAL"):
        logging.getLogger("cotainr.x").log(getattr(logging, level), level)
    out, err = capsys.readouterr()
    printed = [line.rsplit(" ", 1)[-1] for line in (out + err).splitlines()]
    assert printed == shown
