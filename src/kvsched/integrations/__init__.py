"""Plugins that run inside a live engine and write trace v1 while it serves.

Unlike kvsched.adapters, which drive an engine's scheduler on kvsched workloads, these
are loaded by the engine itself (vLLM: `--scheduler-cls
kvsched.integrations.vllm.TracingScheduler`), so kvsched must be installed in the
engine's environment.
"""
