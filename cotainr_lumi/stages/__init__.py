"""The built-in stages of cotainr-lumi and the fixed pipeline they form."""

from .lumi_env.stage import LumiEnvStage
from .pip.stage import PipStage
from .provenance import ProvenanceStage
from .prune.stage import PruneStage
from .system_packages.stage import SystemPackagesStage

#: The stages, in the order they run.
PIPELINE = (SystemPackagesStage, PipStage, PruneStage, LumiEnvStage, ProvenanceStage)
