"""Compile a Triton kernel for a GPU target without a GPU, and read what matters from it:
the PTX (memory scopes of the mailbox ops) and its resources (ptxas -v).

Tier-1 checks run this on a CPU, in a process where Triton is not in interpreter mode."""

from __future__ import annotations

from typing import Any

from .builds import Resources


def compile_for(
    fn: Any, types: dict[str, str], constexprs: dict[str, Any], arch: int = 90, num_warps: int = 4
) -> Any:
    """`fn` compiled for cuda sm_`arch`: `types` names each runtime argument's Triton type
    ("*i32", "i64", "fp32"...), `constexprs` each constexpr's value."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    missing = [n for n in fn.arg_names if n not in types and n not in constexprs]
    if missing:
        raise ValueError(f"compile_for: no type or value for {missing}")
    signature = {n: types.get(n, "constexpr") for n in fn.arg_names}
    consts = {(fn.arg_names.index(n),): v for n, v in constexprs.items()}
    source = ASTSource(fn=fn, signature=signature, constexprs=consts)
    return triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps}
    )


def resources_of(kernel: Any, arch: str = "sm_90a") -> Resources:
    md = kernel.metadata
    return Resources.of_ptx(kernel.asm["ptx"], arch, md.shared, md.num_warps * md.warp_size)
