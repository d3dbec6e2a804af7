from tritonfront.stubs import glue
from tritonfront.core.chunk_packing import pack
from tritonfront.core.delivery import NO_SLOT
from tritonfront.core.detokenization import DETOKENIZER_WINDOW


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            inputs = glue.inputs(request)
            ids, sizes = inputs["token_ids"].reshape(-1).tolist(), inputs["chunk_sizes"].reshape(-1).tolist()
            sender = request.get_response_sender()
            position, k = 0, 0
            while True:
                end = min(len(ids), position + sizes[min(k, len(sizes) - 1)])
                final = end == len(ids)
                chunk = pack(final, "length" if final else "", 0, end, 0, 0, False, False, (0, 0, NO_SLOT, 0),
                             ids[max(0, position - DETOKENIZER_WINDOW):position], (), ids[position:end])
                sender.send(glue.response({"chunk": chunk}), flags=glue.FINAL if final else 0)
                if final:
                    break
                position, k = end, k + 1
        return None
