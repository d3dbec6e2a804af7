import os

from tritonfront.stubs import glue
from tritonfront.triton import devices
from tritonfront.core import model_sources
from tritonfront.core.core_sharing import CoreShare
from tritonfront.core.encoding import BatchMetrics, RaggedEncoder
from tritonfront.core.tokenization import max_sequence_length


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "encoder")
        glue.exit_with_server()
        cores = config.num_threads or os.cpu_count() or 1
        device = devices.configure_torch(args, cores)
        model_dir = model_sources.model_dir(config.model_source)
        self.encoder = RaggedEncoder.from_folder(model_dir, device=device, max_batch_tokens=config.max_batch_tokens,
                                                 max_length=max_sequence_length(model_dir, None))
        self.cores = None
        if device == "cpu" and config.threads == "share":
            index, instances = devices.instance_rank(args)
            # The stub's parent is tritonserver: a table per model per server.
            self.cores = CoreShare.for_instance(args["model_name"], index, instances, os.getppid(), cores)
            self.cores.attach(self.encoder.model)

        self.metrics = BatchMetrics(glue.Metrics({"model": args["model_name"]}))

    def finalize(self):
        glue.outlive_the_stub(self)

    def execute(self, requests):
        if self.cores is None:
            return glue.execute_batch(requests, self.encoder.parse, self.compute)
        with self.cores.computing():
            return glue.execute_batch(requests, self.encoder.parse, self.compute)

    def compute(self, requests):
        self.metrics.observe(self.encoder.batch_shape([len(seq) for sequences in requests for seq in sequences]))
        return self.encoder.encode_requests(requests)
