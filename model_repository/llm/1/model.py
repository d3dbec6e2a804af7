import os

from tritonfront.stubs import glue
from tritonfront.triton import devices
from tritonfront.core import balancing, llmapi_request, model_sources, server_stop
from tritonfront.core.delivery import DeliveryTracker
from tritonfront.core.detokenization import DETOKENIZER_WINDOW
from tritonfront.engines import TORCH_ENGINES, create_engine
from tritonfront.core.fanout import GroupResponder, submit_group
from tritonfront.core.generation_loop import GenerationLoop
from tritonfront.core.generation_request import SequenceRequest, parse_batch
from tritonfront.core.rank_load import GaugeThread, Load, LoadMetrics, ModelLoadMetrics
from tritonfront.core.stop_requests import StopBoard
from tritonfront.stubs.server_metrics import PendingRequests


class TritonPythonModel:
    def initialize(self, args):
        self.config = config = glue.load_config(args, "llm")
        glue.exit_with_server()
        if config.engine in TORCH_ENGINES:
            device = devices.configure_torch(args, config.num_threads)
        else:
            device = devices.instance_device(args)
        rank, ranks = devices.instance_rank(args)
        self.engine = create_engine(config.engine, model_sources.model_dir(config.model_source), device,
                                    config.engine_config(ranks))
        # The stub's parent is tritonserver: a table per model per server.
        self.table = balancing.LoadTable.for_model(args["model_name"], rank, ranks, server_pid=os.getppid())
        self.gate = None
        if config.balancing == "tokens":
            self.gate = balancing.BalancingGate(self.table, config.balancing_timeout_ms / 1000)
        delivery = DeliveryTracker.for_model(args["model_name"], rank, ranks, server_pid=os.getppid(),
                                             timeout_s=config.abandoned_stream_timeout_ms / 1000)
        # Stop requests of the tensorrt_llm model reach any rank: every rank reads them all.
        self.stops = StopBoard.for_model(args["model_name"], rank, ranks, server_pid=os.getppid())
        # Gauges follow the latest load from a thread of their own (GaugeThread says why); the
        # model's totals (no rank label) come from rank 0, out of the shared table.
        self.latest_load = Load()
        self.metrics = glue.Metrics({"model": args["model_name"], "rank": str(rank)})
        load_metrics = LoadMetrics(self.metrics)
        updates = [lambda: load_metrics.update(self.latest_load)]
        if rank == 0:
            self.model_metrics = glue.Metrics({"model": args["model_name"]})
            updates.append(ModelLoadMetrics(self.table.live_loads, PendingRequests(args["model_name"], os.getppid()),
                                            self.model_metrics, self.engine.kv_cache_block_tokens()).update)
        self.gauges = GaugeThread(updates)
        self.loop = GenerationLoop(engine=self.engine, responder=GroupResponder(glue.StreamResponder(), self.stops),
                                   stream_interval=config.stream_interval, max_chunk_rate=config.max_chunk_rate,
                                   context_window=DETOKENIZER_WINDOW, on_load=self.publish, delivery=delivery,
                                   stopping=lambda: server_stop.stop_requested(os.getppid()),
                                   stop_grace_s=config.stop_grace_ms / 1000,
                                   max_cancel_check_rate=config.max_cancel_check_rate)
        self.loop.publish_load()
        self.gauges.start()
        self.loop.start()

    def execute(self, requests):
        """Parses and validates each request, then queues them into the engine, which takes the
        batch in together (Engine.adding_together: a burst starts in one step; parsing, which may
        compile a grammar, stays outside); then holds Triton's thread while this rank has no room
        (max_active_requests unfinished requests) and, with token balancing, while it is not among
        the least-loaded ranks, so that Triton gives the next requests to another rank or keeps
        them in its queue. Responses come from the loop thread."""
        glue.submit_each(requests, self.parse, self.submit, together=self.engine.adding_together)
        self.loop.wait_for_room(self.config.max_active_requests)
        if self.gate is not None:
            self.gate.wait()
        return None

    def submit(self, handle, sequences: list[SequenceRequest]) -> None:
        submit_group(self.loop, handle, sequences, request_id=handle[0].request_id())

    def parse(self, request) -> list[SequenceRequest]:
        """One SequenceRequest per sequence the request asks for (prompts times num_return_sequences),
        each checked by the engine (what it cannot honour, guides that do not compile) before any is
        queued; a request of the tensorrt_llm model by that model's contract (a stop request is
        answered here: Cancelled)."""
        inputs = glue.inputs(request)
        if llmapi_request.follows_contract(inputs):
            return llmapi_request.parse(inputs, request.request_id(), self.engine.vocab_size,
                                        self.engine.context_length, self.engine.check_request, self.stops)
        sequences = parse_batch(inputs, self.engine.vocab_size, self.engine.context_length,
                                self.config.exclude_input_in_output == "true", self.config.default_max_tokens)
        for sequence in sequences:
            self.engine.check_request(sequence.params)
        return sequences

    def publish(self, load: Load) -> None:
        self.table.publish(load)
        self.latest_load = load

    def finalize(self):
        self.gauges.stop()
        self.loop.stop()
        self.table.close()
        glue.outlive_the_stub(self)
