"""The start-up hook files installed at the top of site-packages."""
