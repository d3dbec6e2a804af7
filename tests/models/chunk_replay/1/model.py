import numpy as np

from tritonfront.stubs import glue
from tritonfront.core.detokenization import DETOKENIZER_WINDOW


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            inputs = glue.inputs(request)
            ids, sizes = inputs["token_ids"].reshape(-1), inputs["chunk_sizes"].reshape(-1).tolist()
            sender = request.get_response_sender()
            position, k = 0, 0
            while True:
                end = min(len(ids), position + sizes[min(k, len(sizes) - 1)])
                final = end == len(ids)
                outputs = {
                    "output_ids": ids[position:end].reshape(1, -1),
                    "context_ids": ids[max(0, position - DETOKENIZER_WINDOW):position].reshape(1, -1),
                    "is_final": np.array([[final]]),
                    "finish_reason": np.array([[b"length" if final else b""]], dtype=np.object_),
                    "prompt_tokens": np.array([[0]], dtype=np.int32),
                    "completion_tokens": np.array([[end]], dtype=np.int32),
                }
                sender.send(glue.response(outputs), flags=glue.FINAL if final else 0)
                if final:
                    break
                position, k = end, k + 1
        return None
