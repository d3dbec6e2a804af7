import json

from tritonfront import devices, model_sources, ragged, triton_io
from tritonfront.errors import InvalidInput
from tritonfront.encoding import transformer_subfolder
from tritonfront.pooling import PoolingHead, truncate_dimensions


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        devices.configure_torch(args, int(params["num_threads"]))
        model_dir = model_sources.model_dir(params["model_source"])
        hidden_size = json.loads((transformer_subfolder(model_dir) / "config.json").read_text())["hidden_size"]
        self.head = PoolingHead.from_folder(model_dir, hidden_size)

    def execute(self, requests):
        return triton_io.batch_execute(requests, self.parse, self.compute, self.build)

    def parse(self, request):
        states = triton_io.required(request, "token_states")
        if states.ndim != 3 or states.shape[2] != self.head.hidden_size:
            raise InvalidInput("token_states", f"shape {list(states.shape)} must be [texts, tokens, {self.head.hidden_size}]")
        sequences = ragged.unpad(states, triton_io.required(request, "input_lengths"))
        wanted = set(request.requested_output_names()) or {"embedding"}
        dimensions = triton_io.scalar(request, "dimensions")
        for name, limit in (("embedding", self.head.sentence_dim), ("token_embeddings", self.head.token_dim)):
            if name in wanted:
                self.head.check_dimensions(dimensions, limit)
        return sequences, wanted, dimensions

    def compute(self, requests):
        # One ragged batch for the whole dynamic batch, whichever output each request wants.
        batch = ragged.RaggedBatch.concat([seq for sequences, _, _ in requests for seq in sequences])
        wanted = set().union(*(w for _, w, _ in requests))
        sentences = self.head.sentence_embeddings(batch) if "embedding" in wanted else None
        tokens = batch.split(self.head.token_embeddings(batch)) if "token_embeddings" in wanted else None
        results, start, normalized = [], 0, self.head.normalized
        for sequences, names, dimensions in requests:
            end = start + len(sequences)
            outputs = {}
            if "embedding" in names:
                outputs["embedding"] = truncate_dimensions(sentences[start:end], dimensions, normalized).numpy()
            if "token_embeddings" in names:
                outputs["token_embeddings"] = ragged.pad([truncate_dimensions(t, dimensions, normalized).numpy() for t in tokens[start:end]])
            results.append(outputs)
            start = end
        return results

    @staticmethod
    def build(request, outputs):
        return triton_io.response(outputs)

