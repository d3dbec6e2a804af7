import functools
import os
import threading

import triton_python_backend_utils as pb_utils

from tritonfront import balancing, devices, model_sources, triton_io
from tritonfront.delivery import DeliveryTracker
from tritonfront.detokenization import DETOKENIZER_WINDOW
from tritonfront.engines import EngineConfig, SamplingParams, create_engine
from tritonfront.errors import InvalidInput
from tritonfront.generation import GenerationLoop, Load
from tritonfront.stopping import stop_sequences_from_tensor

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PREPARE_IN = ("execute", "engine_loop")
# 0.1 ms .. ~2.6 s, 25% apart: fine enough to read a P99 of loop steps from.
STEP_SECONDS_BUCKETS = [1e-4 * 1.25**k for k in range(46)]


class LoadMetrics:
    """This rank's load on Triton's metrics endpoint, labelled by model and rank."""

    def __init__(self, model: str, rank: int):
        labels = {"model": model, "rank": str(rank)}
        self.families = []  # a family must outlive its metrics

        def metric(name, description, kind=pb_utils.MetricFamily.GAUGE):
            self.families.append(pb_utils.MetricFamily(name=name, description=description, kind=kind))
            return self.families[-1].Metric(labels=labels)

        self.gauges = {
            "outstanding_tokens": metric("tritonfront_llm_outstanding_tokens",
                                         "Prompt and generated tokens of unfinished requests"),
            "waiting_requests": metric("tritonfront_llm_waiting_requests", "Requests with no token generated yet"),
            "active_sequences": metric("tritonfront_llm_active_sequences", "Unfinished requests"),
            "kv_cache_blocks": metric("tritonfront_llm_kv_cache_blocks", "KV cache blocks held by unfinished requests"),
        }
        self.cancelled = metric("tritonfront_llm_cancelled_requests_total",
                                "Requests cancelled or abandoned by their client", pb_utils.MetricFamily.COUNTER)
        self._labels = labels
        self._last = Load()
        self._lock = threading.Lock()

    def update(self, load: Load) -> None:
        with self._lock:
            for name, gauge in self.gauges.items():
                if getattr(load, name) != getattr(self._last, name):
                    gauge.set(getattr(load, name))
            if load.cancelled_requests > self._last.cancelled_requests:
                self.cancelled.increment(load.cancelled_requests - self._last.cancelled_requests)
            self._last = load

    def step_histogram(self):
        """The observe function of a histogram of the generation loop's step times."""
        self.families.append(pb_utils.MetricFamily(
            name="tritonfront_llm_step_seconds", kind=pb_utils.MetricFamily.HISTOGRAM,
            description="Work of one generation loop turn once the engine's outputs are in hand"))
        return self.families[-1].Metric(labels=self._labels, buckets=STEP_SECONDS_BUCKETS).observe


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        if params["balancing"] not in balancing.BALANCING_MODES:
            raise ValueError(f"balancing must be one of {balancing.BALANCING_MODES}, got {params['balancing']!r}")
        if params["prepare_requests_in"] not in PREPARE_IN:
            raise ValueError(f"prepare_requests_in must be one of {PREPARE_IN}, got {params['prepare_requests_in']!r}")
        if params["record_step_times"] not in ("true", "false"):
            raise ValueError(f"record_step_times must be true or false, got {params['record_step_times']!r}")
        self.prepare_in_loop = params["prepare_requests_in"] == "engine_loop"
        device = devices.configure_torch(args, int(params["num_threads"]))
        config = EngineConfig(max_num_seqs=int(params["max_num_seqs"]), kv_cache_tokens=int(params["kv_cache_tokens"]),
                              max_batch_tokens=int(params["max_batch_tokens"]), dtype=params["dtype"],
                              attention=params["attention"])
        self.engine = create_engine(params["engine"], model_sources.model_dir(params["model_source"]), device, config)
        rank, ranks = balancing.instance_rank(args)
        # The stub's parent is tritonserver: a table per model per server.
        self.table = balancing.LoadTable.for_model(args["model_name"], rank, ranks, server_pid=os.getppid())
        self.gate = None
        if params["balancing"] == "tokens":
            self.gate = balancing.BalancingGate(self.table, int(params["balancing_timeout_ms"]) / 1000)
        self.max_active = int(params["max_active_requests"])
        delivery = DeliveryTracker.for_model(args["model_name"], rank, ranks, server_pid=os.getppid(),
                                             timeout_s=int(params["abandoned_stream_timeout_ms"]) / 1000)
        self.metrics = LoadMetrics(args["model_name"], rank)
        on_step = self.metrics.step_histogram() if params["record_step_times"] == "true" else None
        self.loop = GenerationLoop(self.engine, self, int(params["stream_interval"]), DETOKENIZER_WINDOW,
                                   on_load=self.publish, on_step=on_step, delivery=delivery)
        self.loop.publish_load()
        self.loop.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if self.prepare_in_loop:
                self.loop.hand_over((request, sender), functools.partial(self.parse, request))
                continue
            try:
                self.loop.submit((request, sender), **self.parse(request))
            except Exception as error:  # InvalidInput, or an engine that stopped taking requests
                sender.send(triton_io.error_response(error), flags=FINAL)
        self.loop.wait_for_room(self.max_active)
        if self.gate is not None:
            self.gate.wait()
        return None

    def parse(self, request) -> dict:
        ids = triton_io.required(request, "input_ids")
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise InvalidInput("input_ids", f"shape {list(ids.shape)} must be [1, tokens]: one prompt per request")
        length = int(triton_io.required(request, "input_lengths").reshape(-1)[0])
        if not 1 <= length <= ids.shape[1]:
            raise InvalidInput("input_lengths", f"{length} is outside 1..{ids.shape[1]}")
        prompt = ids[0, :length]
        vocab = self.engine.vocab_size
        if prompt.min() < 0 or prompt.max() >= vocab:
            raise InvalidInput("input_ids", f"token ids must be in 0..{vocab - 1}")
        max_tokens = triton_io.scalar(request, "max_tokens")
        if max_tokens is None:
            raise InvalidInput("max_tokens", "is required")
        params = SamplingParams(
            max_tokens=int(max_tokens),
            temperature=triton_io.scalar(request, "temperature"),
            top_k=int(triton_io.scalar(request, "top_k", 0)),
            top_p=float(triton_io.scalar(request, "top_p", 1.0)),
            random_seed=triton_io.scalar(request, "random_seed"),
            end_id=triton_io.scalar(request, "end_id"),
        ).validate(length, self.engine.context_length, vocab)
        return {"prompt_ids": prompt.tolist(), "params": params,
                "stop_sequences": stop_sequences_from_tensor(triton_io.array(request, "stop_words_ids"), vocab),
                "stream": bool(triton_io.scalar(request, "stream", False)),
                "delivery_acknowledged": bool(triton_io.scalar(request, "delivery_acknowledged", False))}

    def publish(self, load: Load) -> None:
        self.table.publish(load)
        self.metrics.update(load)

    # The generation loop's Responder; a handle is (request, response sender).
    def send(self, handle, chunk) -> None:
        handle[1].send(triton_io.response(chunk.tensors()), flags=FINAL if chunk.final else 0)

    def fail(self, handle, error: Exception) -> None:
        handle[1].send(triton_io.error_response(error), flags=FINAL)

    def is_cancelled(self, handle) -> bool:
        return handle[0].is_cancelled()

    def finalize(self):
        self.loop.stop()
        self.table.close()
