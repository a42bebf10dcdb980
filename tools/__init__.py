"""Development tools run from a checkout, not part of the installed package: the
benchmarks (`python -m tools.bench`, `python -m tools.bench_optimized`) and the docs
renderer (`python -m tools.docs_render`)."""
