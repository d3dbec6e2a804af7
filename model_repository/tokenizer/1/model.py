import numpy as np

from tritonfront import model_sources, triton_io
from tritonfront.tokenization import BatchTokenizer, TextRequest


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        self.tokenizer = BatchTokenizer.from_folder(
            model_sources.model_dir(params["model_source"]), max_text_bytes=int(params["max_text_bytes"])
        )

    def execute(self, requests):
        return triton_io.batch_execute(requests, self.parse, self.tokenizer.encode_requests, self.build)

    @staticmethod
    def parse(request):
        return TextRequest(triton_io.strings(request, "text_input"), bool(triton_io.scalar(request, "truncate", True)))

    @staticmethod
    def build(request, tokenized):
        return triton_io.response({"input_ids": tokenized.input_ids, "input_lengths": tokenized.input_lengths})
