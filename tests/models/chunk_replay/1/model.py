import numpy as np
import triton_python_backend_utils as pb_utils

from tritonfront.detokenization import DETOKENIZER_WINDOW


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "token_ids").as_numpy().reshape(-1)
            sizes = pb_utils.get_input_tensor_by_name(request, "chunk_sizes").as_numpy().reshape(-1).tolist()
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
                response = pb_utils.InferenceResponse([pb_utils.Tensor(name, value) for name, value in outputs.items()])
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
                if final:
                    break
                position, k = end, k + 1
        return None
