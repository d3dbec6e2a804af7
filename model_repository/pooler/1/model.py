from tritonfront.stubs import glue
from tritonfront.triton import devices
from tritonfront.core import model_sources
from tritonfront.core.pooling import PoolingHead


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "pooler")
        glue.exit_with_server()
        devices.configure_torch(args, config.num_threads)
        self.head = PoolingHead.for_model(model_sources.model_dir(config.model_source))

    def execute(self, requests):
        return glue.execute_batch(requests, self.head.parse, self.head.pool_requests, requested_outputs=True)
