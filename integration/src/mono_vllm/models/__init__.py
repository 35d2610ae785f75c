"""mono's model classes: subclasses of vLLM's, registered over them by `mono_vllm.plugin`."""
