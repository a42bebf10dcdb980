"""kvsched: the executable specification of an LLM-serving scheduler step, and its tools."""

__version__ = "0.1.0"
