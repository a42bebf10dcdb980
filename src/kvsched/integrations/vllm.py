"""vLLM's v1 scheduler, unchanged, writing trace v1 while a live engine serves.

    KVSCHED_TRACE_DIR=traces python -m vllm.entrypoints.openai.api_server ... \\
        --no-async-scheduling --scheduler-cls kvsched.integrations.vllm.TracingScheduler

(docs/conformance/vllm-live.md). TracingScheduler is vLLM's Scheduler with a hook
around each public step method and around _preempt_request (to keep the victims'
order, which the scheduler output keeps only as a set): every hook calls vLLM's own
method and returns what it returned, so no decision changes. What it records, and
how, is kvsched.integrations.vllm_trace. A tracing failure never stops the engine: it
is logged once and tracing stops, the trace left without its end line.

This module imports vLLM when imported, so it loads only in vLLM's environment; kvsched
must be installed there (`make vllm-plugin`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kvsched.adapters.vllm_driver import BlockKeys
from kvsched.integrations.vllm_trace import (
    LiveTrace,
    engine_config,
    header_extra,
    line_encoder,
    open_trace,
    trace_dir,
)

# Imported by name: kvsched's own environment (and its type checker) has no vLLM.
_VllmScheduler: Any = importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler
# A child of vLLM's logger, so that its lines appear in the engine's own log.
_log = logging.getLogger("vllm.kvsched")


class TracingScheduler(_VllmScheduler):  # type: ignore[misc]
    """vLLM's v1 Scheduler that writes one trace v1 file per engine process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = engine_config(self)  # refused before any file is made
        pid, started = os.getpid(), datetime.now(UTC)
        folder = trace_dir(os.environ, self.vllm_config.additional_config)
        self.kvsched_trace_path, stream = open_trace(folder, pid, started)
        version = str(importlib.import_module("vllm").__version__)
        keys = BlockKeys(self.kv_cache_manager.block_pool, config.block_size) \
            if config.prefix_caching else None
        self.kvsched_trace: LiveTrace | None = LiveTrace(
            stream, config, {"name": "vllm", "version": version},
            header_extra(config.prefix_caching, pid, started), keys, line_encoder())
        _log.info("kvsched: tracing the scheduler to %s", self.kvsched_trace_path)

    def _record(self, what: Callable[..., None], *args: Any) -> None:
        """what(trace, *args), a LiveTrace method (no closure: the step's calls are
        counted in microseconds); a tracing failure is logged and ends the tracing."""
        trace = self.kvsched_trace
        if trace is None:
            return
        try:
            what(trace, *args)
        except Exception:  # tracing must never stop the engine
            self._tracing_failed(trace)

    def _tracing_failed(self, trace: LiveTrace) -> None:
        _log.exception("kvsched: tracing stopped; %s ends here", self.kvsched_trace_path)
        self.kvsched_trace = None
        with contextlib.suppress(OSError):
            trace.stream.close()

    def add_request(self, request: Any) -> None:
        new = request.request_id not in self.requests  # not a streaming session's next chunk
        super().add_request(request)
        if new:
            self._record(LiveTrace.arrived, request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        pool = self.kv_cache_manager.block_pool
        before = pool.get_num_free_blocks()
        ended = super().finish_requests(request_ids, finished_status)
        if ended:
            freed = pool.get_num_free_blocks() - before
            self._record(LiveTrace.aborted, [r.request_id for r in ended], freed)
        return ended

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._record(LiveTrace.preempted, request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    # The two hooks of every step call the trace without _record and vLLM's method
    # without super(): each call fewer is a fraction of a percent of a light step.
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        output = _VllmScheduler.schedule(self, *args, **kwargs)
        trace = self.kvsched_trace
        if trace is not None:
            try:
                trace.scheduled(output, started)
            except Exception:  # tracing must never stop the engine
                self._tracing_failed(trace)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = _VllmScheduler.update_from_output(self, scheduler_output,
                                                    model_runner_output)
        trace = self.kvsched_trace
        if trace is not None:
            try:
                trace.updated(outputs, self.kv_cache_manager.block_pool.get_num_free_blocks())
            except Exception:  # tracing must never stop the engine
                self._tracing_failed(trace)
        return outputs

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            drained = self.get_num_unfinished_requests() == 0
            self._record(LiveTrace.close, drained)
