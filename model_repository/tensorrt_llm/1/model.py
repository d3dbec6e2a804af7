from tritonfront.stubs import glue
from tritonfront.core import llmapi_contract


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "tensorrt_llm")
        glue.exit_with_server()
        self.forwarder = glue.DecoupledForwarder(config.decoupled_model, [spec.name for spec in llmapi_contract.OUTPUTS],
                                                 config.max_in_flight, llmapi_contract.error_code)

    def execute(self, requests):
        self.forwarder.execute(requests, llmapi_contract.check_not_streaming)
        return None

    def finalize(self):
        self.forwarder.close()
