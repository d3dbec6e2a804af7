from tritonfront import devices, model_sources, ragged, triton_io
from tritonfront.encoding import RaggedEncoder


class TritonPythonModel:
    def initialize(self, args):
        params = triton_io.parameters(args)
        device = devices.configure_torch(args, int(params["num_threads"]))
        self.encoder = RaggedEncoder.from_folder(
            model_sources.model_dir(params["model_source"]), device=device,
            max_batch_tokens=int(params["max_batch_tokens"]),
        )

    def execute(self, requests):
        return triton_io.batch_execute(requests, self.parse, self.compute, self.build)

    def parse(self, request):
        ids = triton_io.required(request, "input_ids")
        lengths = triton_io.required(request, "input_lengths").reshape(-1)
        return self.encoder.split_sequences(ids, lengths)

    def compute(self, requests):
        states = iter(self.encoder.encode([seq for sequences in requests for seq in sequences]))
        return [[next(states) for _ in sequences] for sequences in requests]

    @staticmethod
    def build(request, states):
        return triton_io.response({"token_states": ragged.pad(states)})
