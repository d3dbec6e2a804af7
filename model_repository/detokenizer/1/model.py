import os

from tritonfront.stubs import glue
from tritonfront.core import model_sources
from tritonfront.core.delivery import Acknowledger
from tritonfront.core.detokenization import DetokenizeRequest, StreamDetokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = glue.load_config(args, "detokenizer")
        glue.exit_with_server()
        self.detokenizer = StreamDetokenizer.from_folder(model_sources.model_dir(config.model_source))
        self.acknowledger = Acknowledger(server_pid=os.getppid())  # the stub's parent is tritonserver

    def execute(self, requests):
        # A chunk of a cancelled ensemble request reaches here (this model has no dynamic batcher to
        # drop it, config.pbtxt says why) and is answered, its stream refused to the llm. The
        # chunks are acknowledged only once their responses were sent (Acknowledger.acknowledge_later).
        responses = glue.execute_batch(requests, DetokenizeRequest.parse, self.compute, cancellation=True)
        try:
            glue.send_each(requests, responses)
        finally:
            self.acknowledger.flush()
        return None

    def compute(self, requests):
        return self.detokenizer.respond(requests, self.acknowledger.acknowledge_later, self.acknowledger.refuse_later)
