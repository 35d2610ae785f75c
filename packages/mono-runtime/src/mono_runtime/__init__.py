"""mono_runtime: the in-kernel collective protocol of mono (host half), step planner, builds.

The device half is `mono_runtime.protocol_triton` (Triton helpers); PROTOCOL.md describes
both. Triton and mono_peer are imported only by the modules (and calls) that need them.
"""

from .errors import MonoFault, MonoUnsupported
from .planner import GraphMode, Step, StepMeta, agree, plan, step_reason
from .runner import MonoRunner

__all__ = [
    "GraphMode",
    "MonoFault",
    "MonoRunner",
    "MonoUnsupported",
    "Step",
    "StepMeta",
    "agree",
    "plan",
    "step_reason",
]
__version__ = "0.1.1"
