"""The built-in stages of cotainr-lumi and the fixed pipeline they form."""

from .lumi_env.stage import LumiEnvStage
from .pip.stage import PipStage
from .provenance import ProvenanceStage
from .prune.stage import PruneStage

#: The stages, in the order they run.
PIPELINE = (PipStage, PruneStage, LumiEnvStage, ProvenanceStage)
