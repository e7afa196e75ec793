"""
cotainr-lumi as a cotainr plugin.

The start-up hook (``_cotainr_plugins_hook``) calls :func:`activate` through
the ``cotainr.plugins`` entry point when ``cotainr.cli`` is imported.

Functions
---------
activate(cli_module)
    Make the stock ``cotainr`` command use cotainr-lumi's build and info.
"""

import logging

logger = logging.getLogger(f"cotainr.{__name__}")


def activate(cli_module):
    """
    Make the stock ``cotainr`` command use cotainr-lumi's build and info.

    Stock builds (stock systems, ``--base-image`` without cotainr-lumi
    options) still run cotainr's own code unchanged.

    Parameters
    ----------
    cli_module : module
        The ``cotainr.cli`` module.

    Raises
    ------
    :class:`cotainr_lumi.errors.UnsupportedCotainrError`
        If the installed cotainr is outside the tested range (nothing is
        changed then).
    """
    from .. import _cotainr, cli

    _cotainr.check_cotainr_version()
    cli.patch_stock_cli(cli_module=cli_module)
