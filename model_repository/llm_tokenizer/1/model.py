from tritonfront.stubs import glue
from tritonfront.core import llmapi_contract, model_sources, trtllm_contract
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
        # The first step of generate, ensemble and tensorrt_llm: a stray parameter fails the request
        # before it runs, checked against the contract the request follows.
        batch = PromptBatch.parse(inputs)
        contract = llmapi_contract if batch.llmapi else trtllm_contract
        contract.check_request_parameters(parameters)
        return batch
