"""Adapters that drive real engines' schedulers on kvsched workloads and write trace v1.

Each engine runs in its own environment; an adapter here maps kvsched's config to the
engine's, runs a driver script with the engine's Python, and assembles the trace.
"""
