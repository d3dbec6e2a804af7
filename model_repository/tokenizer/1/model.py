from tritonfront.stubs import glue
from tritonfront.core import model_sources
from tritonfront.core.tokenization import BatchTokenizer, TextRequest


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "tokenizer")
        glue.exit_with_server()
        self.tokenizer = BatchTokenizer.from_folder(model_sources.model_dir(config.model_source),
                                                    max_text_bytes=config.max_text_bytes)

    def execute(self, requests):
        return glue.execute_batch(requests, TextRequest.parse, self.tokenizer.respond)
