import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tritonfront import model_sources, triton_io
from tritonfront.delivery import Acknowledger
from tritonfront.detokenization import Chunk, StreamDetokenizer

PASSED_THROUGH = ("finish_reason", "prompt_tokens", "completion_tokens")


@dataclass
class ParsedRequest:
    chunks: list[Chunk]
    passed_through: dict[str, np.ndarray]
    delivery: Optional[np.ndarray]


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        self.detokenizer = StreamDetokenizer.from_folder(model_sources.model_dir(params["model_source"]))
        self.acknowledger = Acknowledger(server_pid=os.getppid())  # the stub's parent is tritonserver

    def execute(self, requests):
        return triton_io.batch_execute(requests, self.parse, self.compute, self.build)

    @staticmethod
    def parse(request) -> ParsedRequest:
        # Triton has checked that every input has the same batch size (rows).
        output_ids = triton_io.required(request, "output_ids")
        rows = output_ids.shape[0]
        context_ids = triton_io.required(request, "context_ids")
        is_final = triton_io.required(request, "is_final").reshape(rows)
        passed_through = {name: triton_io.required(request, name).reshape(rows, 1) for name in PASSED_THROUGH}
        chunks = [Chunk(context.tolist(), output.tolist(), bool(final))
                  for context, output, final in zip(context_ids, output_ids, is_final)]
        return ParsedRequest(chunks, passed_through, triton_io.array(request, "delivery"))

    def compute(self, parsed: list[ParsedRequest]) -> list:
        results = self.detokenizer.detokenize_requests([request.chunks for request in parsed])
        for request, result in zip(parsed, results):
            if request.delivery is not None and not isinstance(result, Exception):
                self.acknowledger.acknowledge(request.delivery)
        return [result if isinstance(result, Exception) else {
            "text_output": np.array([[text.encode("utf-8")] for text in result], dtype=np.object_),
            **request.passed_through,
        } for request, result in zip(parsed, results)]

    @staticmethod
    def build(request, outputs: dict):
        return triton_io.response(outputs)
