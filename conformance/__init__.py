"""The conformance suites of vLLM's schedulers, run from a checkout, not part of the
installed package: `python -m conformance.vllm` (vLLM v1, docs/conformance/vllm.md) and
`python -m conformance.vllm_v0` (vLLM V0, docs/conformance/vllm-v0.md), which `make
conformance-vllm`, `make conformance-vllm-0.33` and `make conformance-vllm-v0` run
(scripts/conformance_vllm.sh). They record with the adapters of the package
(kvsched.adapters) and check with kvsched.conformance."""
