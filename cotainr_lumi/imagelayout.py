"""
What cotainr-lumi puts where in an image: its paths and its label names.

A leaf module (it imports nothing), like :mod:`cotainr_lumi.errors`: the
stages that write these paths and labels, the engine and ``cotainr-lumi
verify`` that reads them all take them from here, so an image's layout is
written down once. ``tests/test_layout.py`` checks that no other module
spells a label name or one of these paths itself.

Paths are absolute paths inside the image; label names are the keys of
``apptainer inspect --labels``.
"""

# -- Apptainer's metadata directory ------------------------------------------

#: The scripts Apptainer sources (in name order) when a container starts.
ENV_SCRIPTS_DIR = "/.singularity.d/env"
#: The labels of the image (``apptainer inspect --labels``).
LABELS_FILE = "/.singularity.d/labels.json"
#: The lumi-env stage's env file, sourced after cotainr's ``92-cotainr-env.sh``.
LUMI_ENV_FILE = f"{ENV_SCRIPTS_DIR}/93-cotainr-lumi-env.sh"
#: The lumi-env stage's MPI env file (which libmpi.so.12 MPI users load). After
#: Apptainer's ``99-base.sh``, where ``APPTAINERENV_``/``SINGULARITYENV_`` and
#: ``--env`` values are applied, so it sees those run-time overrides.
MPI_ENV_FILE = f"{ENV_SCRIPTS_DIR}/99-cotainr-lumi-mpi.sh"

# -- cotainr-lumi's own directory: records of the build -----------------------

#: Everything cotainr-lumi records in the image lives below this directory.
RECORDS_DIR = "/opt/cotainr-lumi"
#: The build's answer to "which Python environment" (engine/targetenv.py).
TARGET_ENV_FILE = f"{RECORDS_DIR}/target-env.json"
#: The provenance stage's JSON record.
PROVENANCE_FILE = f"{RECORDS_DIR}/provenance.json"
#: The prune stage's manifest (every change and every skipped group).
PRUNE_MANIFEST_FILE = f"{RECORDS_DIR}/prune-manifest.json"
#: The pip stage's records: ``stepN/`` (the requirement files as used),
#: :data:`PIP_STEPS_FILE` and :data:`PIP_PACKAGES_FILE`.
PIP_DIR = f"{RECORDS_DIR}/pip"
#: The pip steps and their pip commands.
PIP_STEPS_FILE = f"{PIP_DIR}/steps.json"
#: ``pip list --format json`` after the pip stage.
PIP_PACKAGES_FILE = f"{PIP_DIR}/packages.json"
#: The pip stage's scratch directory (cache, staged files); removed after it.
PIP_WORK_DIR = f"{RECORDS_DIR}/.pip-work"
#: The script ``$WITH_CONDA`` sources (lumi-env stage).
WITH_CONDA_FILE = f"{RECORDS_DIR}/with-conda.sh"
#: The lumi-env stage's MPI record: the image's MPI, its users, the mode and
#: the host binding (``cotainr-lumi verify`` reads it).
MPI_FILE = f"{RECORDS_DIR}/mpi.json"

# -- Today's LUMI images: network layer, SBOM, earlier builds (issue 19) -------

#: lumi-env: the image's network layer as built (plugin, libfabric, GDR, binds).
RUNTIME_FILE = f"{RECORDS_DIR}/runtime.json"
#: pip: the target env's packages as a CycloneDX JSON SBOM.
CYCLONEDX_SBOM_FILE = f"{RECORDS_DIR}/sbom.cdx.json"
#: The LUMI AI Factory images' own SBOM (``{"apt": [...], "pip": [...]}``).
AIF_SBOM_FILE = "/.sbom.json"
#: The records of the build an image was built on (``history/1`` the oldest),
#: moved there before this build writes its own.
HISTORY_DIR = f"{RECORDS_DIR}/history"

# -- The LUMI runtime layout (lumi-env stage) ---------------------------------

#: The runscripts (``get-master``, ``conda-python-simple``, ...), on ``PATH``.
RUNSCRIPTS_DIR = "/runscripts"
#: Where the module file mounts ``$CONTAINERROOT/user-software``.
USER_SOFTWARE_DIR = "/user-software"

# -- Label names ---------------------------------------------------------------

#: Every label cotainr-lumi sets starts with this.
LABEL_PREFIX = "cotainr-lumi."

#: provenance: the cotainr-lumi version that built the image.
LABEL_VERSION = "cotainr-lumi.version"
#: provenance: the cotainr version that built the image.
LABEL_COTAINR_VERSION = "cotainr-lumi.cotainr-version"
#: provenance: the system (``--system``) built for.
LABEL_SYSTEM = "cotainr-lumi.system"
#: provenance: the base image as given.
LABEL_BASE_IMAGE = "cotainr-lumi.base-image"
#: provenance: the base image's real path (links resolved).
LABEL_BASE_IMAGE_RESOLVED = "cotainr-lumi.base-image.resolved"
#: provenance: the base image's sha256 (a local file).
LABEL_BASE_IMAGE_SHA256 = "cotainr-lumi.base-image.sha256"
#: provenance: the stages run, in order, comma separated.
LABEL_STAGES = "cotainr-lumi.stages"
#: provenance: :data:`PROVENANCE_FILE`.
LABEL_PROVENANCE = "cotainr-lumi.provenance"
#: engine: the prefix of the target Python environment.
LABEL_TARGET_ENV = "cotainr-lumi.target-env"
#: pip: :data:`PIP_PACKAGES_FILE`.
LABEL_PIP_PACKAGES = "cotainr-lumi.pip.packages"
#: pip: :data:`PIP_STEPS_FILE`.
LABEL_PIP_STEPS = "cotainr-lumi.pip.steps"
#: prune: :data:`PRUNE_MANIFEST_FILE`.
LABEL_PRUNE_MANIFEST = "cotainr-lumi.prune.manifest"
#: prune: the bytes the prune stage saved.
LABEL_PRUNE_BYTES_SAVED = "cotainr-lumi.prune.bytes-saved"
#: lumi-env: the binds the module file sets (comma separated).
LABEL_BINDS = "cotainr-lumi.binds"
#: lumi-env: :data:`LUMI_ENV_FILE`.
LABEL_ENV_FILE = "cotainr-lumi.env-file"
#: lumi-env: the variables the env file sets (comma separated).
LABEL_ENV = "cotainr-lumi.env"
#: lumi-env: :data:`RUNSCRIPTS_DIR`.
LABEL_RUNSCRIPTS = "cotainr-lumi.runscripts"

#: lumi-env: the MPI mode (``container``, ``host`` or ``none``).
LABEL_MPI = "cotainr-lumi.mpi"
#: lumi-env: :data:`MPI_FILE`.
LABEL_MPI_RECORD = "cotainr-lumi.mpi.record"

# -- Today's LUMI images (issue 19) -------------------------------------------

#: lumi-env: :data:`RUNTIME_FILE`.
LABEL_RUNTIME = "cotainr-lumi.runtime"
#: pip: :data:`CYCLONEDX_SBOM_FILE`.
LABEL_SBOM = "cotainr-lumi.sbom"
#: engine: the base image's ROCm version (its ``.info/version``).
LABEL_ROCM_VERSION = "cotainr-lumi.rocm.version"
#: engine: the ROCm versions LUMI's GPU driver supports, per the profile.
LABEL_ROCM_SUPPORTED = "cotainr-lumi.rocm.supported"
#: engine: the ROCm torch was built for (``+rocmX.Y``).
LABEL_ROCM_TORCH = "cotainr-lumi.rocm.torch"
#: engine: how many earlier cotainr-lumi builds the image was built on.
LABEL_HISTORY = "cotainr-lumi.history"
