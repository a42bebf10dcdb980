"""Proofs: CrossHair obligations over the spec's and the reference's arithmetic and
decisions, diffbehavior pairs, and a bounded model checker of the reference scheduler.

Run them all with `make proofs` (python -m proofs.run); docs/proofs.md lists every
obligation with its status and how to reproduce it.
"""
