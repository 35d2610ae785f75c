"""A kernel as a first-class idea: its argument spec (`spec`), the Build interface of its
variants on each backend (`build`), the registry that `mono qualify` and `mono bench`
iterate (`registry`), the LayerRunner base of the runners that launch it
(`layer_runner`) and the check of each tensor they pass (`tensors`). The kernel
packages implement them; the runtime knows no model."""

from .build import INTERPRETER, Build, Compiled, target_name
from .layer_runner import LayerRunner
from .spec import RUNTIME_ARGS, Arg, KernelSpec
from .tensors import check_tensor, same_device

__all__ = [
    "INTERPRETER",
    "RUNTIME_ARGS",
    "Arg",
    "Build",
    "Compiled",
    "KernelSpec",
    "LayerRunner",
    "check_tensor",
    "same_device",
    "target_name",
]
