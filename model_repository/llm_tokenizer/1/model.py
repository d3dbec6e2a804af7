import numpy as np

from tritonfront import model_sources, triton_io
from tritonfront.errors import InvalidInput
from tritonfront.tokenization import PromptRequest, PromptTokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        self.tokenizer = PromptTokenizer.from_folder(
            model_sources.model_dir(params["model_source"]), max_text_bytes=int(params["max_text_bytes"])
        )

    def execute(self, requests):
        return triton_io.batch_execute(requests, self.parse, self.tokenizer.encode_prompts, self.build)

    @staticmethod
    def parse(request):
        texts = triton_io.strings(request, "text_input")
        if len(texts) != 1:
            raise InvalidInput("text_input", f"one prompt per request, got {len(texts)}")
        has_stop_words = triton_io.array(request, "stop_words") is not None
        stop_words = triton_io.strings(request, "stop_words") if has_stop_words else []
        return PromptRequest(texts[0], bool(triton_io.scalar(request, "apply_chat_template", False)), stop_words)

    @staticmethod
    def build(request, prompt):
        return triton_io.response({"input_ids": prompt.input_ids, "input_lengths": prompt.input_lengths,
                                   "stop_words_ids": prompt.stop_words_ids,
                                   "delivery_acknowledged": np.array([[True]])})
