"""
The engine: what a stage is, how a build is planned and run.

:mod:`.stage` (the stage base class and registry), :mod:`.settings` (stage
settings declared once and the one loader; :mod:`.origins` words its errors,
:mod:`.yamlfile` reads users' YAML with line numbers), :mod:`.profiles` (system
profiles, read from ``systems.yaml`` files), :mod:`.plan` (a build request
resolved into a plan), :mod:`.pipeline` (runs a plan around cotainr's
sandbox), :mod:`.rootfs` (paths resolved inside a sandbox, never on the host),
:mod:`.elfinfo` (the dynamic-linking facts of ELF files, with pyelftools),
:mod:`.targetenv` and :mod:`.imageprobe` (the one discovery of the Python
environment a build installs into, shared by every stage, ``verify`` and the
plan).
The engine imports no stage; stages import the engine.
"""
