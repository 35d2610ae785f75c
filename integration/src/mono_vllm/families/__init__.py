"""One `LayerKernels` class per model: which of vLLM's loaded decoder layers a kernel
replaces, what the kernels check in them, and the callables that replace them.

A family is constructed as ``Family(backbone, deployment, rank, world)`` over vLLM's
backbone (``KimiLinearModel`` / ``MiniMaxM3Model``) once the weights are loaded, and
declares ``support`` (a `mono_vllm.deployment.KernelSupport`) and ``metadata_key`` (the
attention-metadata key of a layer it replaces, read by the StepMeta adapter).
"""
