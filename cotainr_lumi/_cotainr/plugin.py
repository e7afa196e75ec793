"""
cotainr-lumi as a cotainr plugin.

:func:`activate` is the ``cotainr.plugins`` entry point. A cotainr with the
upstream plugin support (``docs/upstream/``) calls it with no arguments when
its CLI is first constructed; cotainr-lumi then registers a build stage and
a systems source on cotainr's public seam. An older cotainr has no plugin
support: the start-up hook (``_cotainr_plugins_hook``) calls it with the
``cotainr.cli`` module instead, and cotainr-lumi swaps in its ``Build`` and
``Info`` subcommands (the fallback path).

Functions
---------
activate(cli_module=None)
    Make the stock ``cotainr`` command use cotainr-lumi.
"""

import logging

logger = logging.getLogger(f"cotainr.{__name__}")


def activate(cli_module=None):
    """
    Make the stock ``cotainr`` command use cotainr-lumi.

    Stock builds (stock systems, ``--base-image`` without cotainr-lumi
    options) still run cotainr's own code unchanged.

    Parameters
    ----------
    cli_module : module, optional
        The ``cotainr.cli`` module (given by the start-up hook only).

    Raises
    ------
    :class:`cotainr_lumi.errors.UnsupportedCotainrError`
        If the installed cotainr's internals do not match what cotainr-lumi
        needs (nothing is changed then; stock cotainr keeps working).
    """
    from .. import _cotainr
    from . import seam

    if seam.has_build_stage_seam():
        from .. import seamstage

        seamstage.register()
        return
    _cotainr.check_cotainr_version()
    if (
        cli_module is None
    ):  # pragma: no cover - cotainr calls plugins only with the seam
        from cotainr import cli as cli_module
    from .. import cli

    cli.patch_stock_cli(cli_module=cli_module)
