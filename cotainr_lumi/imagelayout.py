"""
What cotainr-lumi puts where in an image: its paths and its label names.

Written down once (``tests/test_layout.py`` checks that no other module spells
them). Paths are absolute paths inside the image; label names are the keys of
``apptainer inspect --labels``.
"""

#: The scripts Apptainer sources (in name order) when a container starts.
ENV_SCRIPTS_DIR = "/.singularity.d/env"
#: The labels of the image (``apptainer inspect --labels``).
LABELS_FILE = "/.singularity.d/labels.json"
#: The definition the image was built from (earlier ones in ``bootstrap_history``).
DEFINITION_FILE = "/.singularity.d/Singularity"
#: What ``run`` runs: the image's runscript (an OCI ENTRYPOINT is run by it).
RUNSCRIPT_FILE = "/.singularity.d/runscript"
#: The lumi-env stage's env file, sourced after cotainr's ``92-cotainr-env.sh``.
LUMI_ENV_FILE = f"{ENV_SCRIPTS_DIR}/93-cotainr-lumi-env.sh"
#: The lumi-env stage's MPI env file (which libmpi.so.12 MPI users load). After
#: Apptainer's ``99-base.sh``, where ``APPTAINERENV_``/``SINGULARITYENV_`` and
#: ``--env`` values are applied, so it sees those run-time overrides.
MPI_ENV_FILE = f"{ENV_SCRIPTS_DIR}/99-cotainr-lumi-mpi.sh"
#: The env file giving ``exec`` the environment the runscript prepares: the
#: last one (after ``99-runtimevars.sh``), so the runscript sees all the others.
ENTRYPOINT_ENV_FILE = f"{ENV_SCRIPTS_DIR}/99-zz-cotainr-lumi-entrypoint.sh"

#: Everything cotainr-lumi records in the image lives below this directory.
RECORDS_DIR = "/opt/cotainr-lumi"
#: The entry point's report: its process's environment, one NAME=VALUE a line.
ENTRYPOINT_REPORTER_FILE = f"{RECORDS_DIR}/entrypoint-env"
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
#: The system-packages stage's record (the packages added, their versions).
SYSTEM_PACKAGES_FILE = f"{RECORDS_DIR}/system-packages.json"
#: Its scratch directory (apt's package lists and downloads); removed after it.
SYSTEM_PACKAGES_WORK_DIR = f"{RECORDS_DIR}/.system-packages-work"
#: The script ``$WITH_CONDA`` sources (lumi-env stage).
WITH_CONDA_FILE = f"{RECORDS_DIR}/with-conda.sh"
#: The lumi-env stage's MPI record: the image's MPI, its users, the mode and
#: the host binding (``cotainr-lumi verify`` reads it).
MPI_FILE = f"{RECORDS_DIR}/mpi.json"
#: lumi-env: the image's network layer as built (plugin, libfabric, GDR, binds).
RUNTIME_FILE = f"{RECORDS_DIR}/runtime.json"
#: pip: the target env's packages as a CycloneDX JSON SBOM.
CYCLONEDX_SBOM_FILE = f"{RECORDS_DIR}/sbom.cdx.json"
#: The LUMI AI Factory images' own SBOM (``{"apt": [...], "pip": [...]}``).
AIF_SBOM_FILE = "/.sbom.json"
#: The records of the build an image was built on (``history/1`` the oldest),
#: moved there before this build writes its own.
HISTORY_DIR = f"{RECORDS_DIR}/history"

#: The runscripts (``get-master``, ``conda-python-simple``, ...), on ``PATH``.
RUNSCRIPTS_DIR = "/runscripts"
#: Where the module file mounts ``$CONTAINERROOT/user-software``.
USER_SOFTWARE_DIR = "/user-software"

#: Every label cotainr-lumi sets starts with this.
LABEL_PREFIX = "cotainr-lumi."

# provenance: the cotainr-lumi and cotainr versions, the system (``--system``),
# the base image as given, its real path (links resolved) and the sha256 of a
# local one, the stages run (comma separated) and :data:`PROVENANCE_FILE`.
LABEL_VERSION = "cotainr-lumi.version"
LABEL_COTAINR_VERSION = "cotainr-lumi.cotainr-version"
LABEL_SYSTEM = "cotainr-lumi.system"
LABEL_BASE_IMAGE = "cotainr-lumi.base-image"
LABEL_BASE_IMAGE_RESOLVED = "cotainr-lumi.base-image.resolved"
LABEL_BASE_IMAGE_SHA256 = "cotainr-lumi.base-image.sha256"
LABEL_STAGES = "cotainr-lumi.stages"
LABEL_PROVENANCE = "cotainr-lumi.provenance"

# engine: the target Python environment's prefix, the base image's ROCm (its
# ``.info/version``), the ROCm versions LUMI's GPU driver supports (per the
# profile), the ROCm torch was built for (``+rocmX.Y``) and how many earlier
# cotainr-lumi builds the image was built on.
LABEL_TARGET_ENV = "cotainr-lumi.target-env"
LABEL_ROCM_VERSION = "cotainr-lumi.rocm.version"
LABEL_ROCM_SUPPORTED = "cotainr-lumi.rocm.supported"
LABEL_ROCM_TORCH = "cotainr-lumi.rocm.torch"
LABEL_HISTORY = "cotainr-lumi.history"
LABEL_PAD = "cotainr-lumi.labels-pad"
#: A layered image's layers (``apptainer inspect``): the base, then each layer.
LABEL_LAYERS = "cotainr-lumi.layers"
#: The squashfs compressor of the image (``build.compression``, or gzip where the
#: runtime could not run that); of a layered image, its layer's.
LABEL_COMPRESSION = "cotainr-lumi.compression"

# pip: :data:`PIP_PACKAGES_FILE`, :data:`PIP_STEPS_FILE`, :data:`CYCLONEDX_SBOM_FILE`.
LABEL_PIP_PACKAGES = "cotainr-lumi.pip.packages"
LABEL_PIP_STEPS = "cotainr-lumi.pip.steps"
LABEL_SBOM = "cotainr-lumi.sbom"

# system-packages: :data:`SYSTEM_PACKAGES_FILE`.
LABEL_SYSTEM_PACKAGES = "cotainr-lumi.system-packages"

# prune: :data:`PRUNE_MANIFEST_FILE` and the bytes the stage saved.
LABEL_PRUNE_MANIFEST = "cotainr-lumi.prune.manifest"
LABEL_PRUNE_BYTES_SAVED = "cotainr-lumi.prune.bytes-saved"

# lumi-env: the binds the module file sets (comma separated),
# :data:`LUMI_ENV_FILE` and the variables it sets (comma separated),
# :data:`RUNSCRIPTS_DIR`, the MPI mode (``container``, ``host`` or ``none``),
# :data:`MPI_FILE` and :data:`RUNTIME_FILE`.
LABEL_BINDS = "cotainr-lumi.binds"
LABEL_ENV_FILE = "cotainr-lumi.env-file"
LABEL_ENV = "cotainr-lumi.env"
LABEL_RUNSCRIPTS = "cotainr-lumi.runscripts"
LABEL_MPI = "cotainr-lumi.mpi"
LABEL_MPI_RECORD = "cotainr-lumi.mpi.record"
LABEL_RUNTIME = "cotainr-lumi.runtime"
LABEL_OCI_ENTRYPOINT = "cotainr-lumi.oci-entrypoint"
