"""kvsched.testing: what a test suite of schedulers needs.

- `kvsched.testing.implementations`: build a scheduler of each implementation (the
  reference, the optimized one on cpu or cuda) from one factory, so that one suite runs
  on all of them (PEP 399's pattern);
- `kvsched.testing.seeded_bugs`: the reference with one realistic fault planted, each
  with the config and workload that expose it and the invariant the checker must name.
"""
