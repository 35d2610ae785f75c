"""Compile a Triton kernel for a GPU target without a GPU, and read what matters from it:
the PTX (memory scopes of the mailbox ops) and its resources (ptxas -v).

Tier-1 checks run this on a CPU, in a process where Triton is not in interpreter mode."""

from __future__ import annotations

import re
from typing import Any

from .builds import Resources

TARGETS = ("sm90", "gfx950")


def gpu_acquires(ptx: str) -> int:
    """GPU-scope acquires in `ptx`, either way a wait takes them (protocol.ACQUIRE_WAYS:
    an acquire add, Triton's `atom.global.gpu.acquire`; an acquire load, the inline
    `ld.acquire.gpu.global`) or Triton's own acquire loads."""
    return len(re.findall(r"(?:ld|atom)\.global\.gpu\.acquire|ld\.acquire\.gpu\.global", ptx))


def compile_for(
    fn: Any,
    types: dict[str, str],
    constexprs: dict[str, Any],
    num_warps: int = 4,
    target: str = "sm90",
    maxnreg: int | None = None,
) -> Any:
    """`fn` compiled for `target` (one of TARGETS): `types` names each runtime argument's
    Triton type ("*i32", "i64", "fp32"...), `constexprs` each constexpr's value. Pointers
    are taken as 16-byte aligned, as torch allocations are at launch: without it Triton
    cannot vectorize loads, and the binary is not the one that runs. `maxnreg`: a cap on
    each thread's registers (NVIDIA; None: the compiler's choice). Gluon kernels too."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource

    missing = [n for n in fn.arg_names if n not in types and n not in constexprs]
    if missing:
        raise ValueError(f"compile_for: no type or value for {missing}")
    gpus = {"sm90": ("cuda", 90, 32), "gfx950": ("hip", "gfx950", 64)}
    if target not in gpus:
        raise ValueError(f"compile_for: target {target!r} is not one of {TARGETS}")
    gpu = GPUTarget(*gpus[target])
    signature = {n: types.get(n, "constexpr") for n in fn.arg_names}
    consts = {(fn.arg_names.index(n),): v for n, v in constexprs.items()}
    aligned = [fn.arg_names.index(n) for n, t in types.items() if t.startswith("*")]
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs=consts,
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(source, target=gpu, options=options)


def resources_of(kernel: Any, arch: str = "sm_90a") -> Resources:
    md = kernel.metadata
    return Resources.of_ptx(kernel.asm["ptx"], arch, md.shared, md.num_warps * md.warp_size)
