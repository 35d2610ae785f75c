"""The MiniMax-M3 FFN monokernel: spec, reference, Triton and FlyDSL builds, runner, bench."""
