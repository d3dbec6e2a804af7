import triton_glue
from tritonfront import devices, model_sources
from tritonfront.encoding import RaggedEncoder


class TritonPythonModel:
    def initialize(self, args):
        config = triton_glue.load_config(args, "encoder")
        device = devices.configure_torch(args, config.num_threads)
        self.encoder = RaggedEncoder.from_folder(model_sources.model_dir(config.model_source), device=device,
                                                 max_batch_tokens=config.max_batch_tokens)

    def execute(self, requests):
        return triton_glue.execute_batch(requests, self.encoder.parse, self.encoder.encode_requests)
