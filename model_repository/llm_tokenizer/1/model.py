from tritonfront.stubs import glue
from tritonfront.core import model_sources, trtllm_contract
from tritonfront.core.tokenization import PromptBatch, PromptTokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "llm_tokenizer")
        glue.exit_with_server()
        self.tokenizer = PromptTokenizer.from_folder(model_sources.model_dir(config.model_source),
                                                     max_text_bytes=config.max_text_bytes)

    def execute(self, requests):
        return glue.execute_batch(requests, self.parse, self.tokenizer.respond, request_parameters=True)

    @staticmethod
    def parse(inputs, parameters) -> PromptBatch:
        # generate's and ensemble's first step: a stray parameter fails the request before it runs.
        trtllm_contract.check_request_parameters(parameters)
        return PromptBatch.parse(inputs)
