"""mono_runtime: the in-kernel collective protocol of mono (host half), step planner, builds.

The device half is `mono_runtime.protocol_triton` (Triton helpers); PROTOCOL.md describes
both. Heavy imports (torch, triton, mono_peer) happen only in the modules that need them.
"""

from .errors import MonoFault, MonoUnsupported
from .planner import GraphMode, Step, StepMeta, agree, plan, step_reason

__all__ = [
    "GraphMode",
    "MonoFault",
    "MonoUnsupported",
    "Step",
    "StepMeta",
    "agree",
    "plan",
    "step_reason",
]
__version__ = "0.1.0"
