"""The front's client of Triton: one gRPC channel (tritonclient's asyncio client) for every request.

Generation always goes as a bidirectional gRPC stream with `stream` true, one stream per prompt,
even when the OpenAI client asked for a whole answer: the llm learns that a stream was abandoned
from chunks its detokenizer never acknowledged, which a non-streamed request never sends. When the
OpenAI client leaves, its stream is cancelled; Triton cancels the request and the llm frees the
sequence. A stream that sends nothing for `stream_timeout` seconds is cancelled the same way and
ends with an error (a dead llm stub never answers its requests again: Python backend r24.10). A
stream ends at Triton's final-response flag.

Embeddings are unary calls bounded by the same deadline.

A model whose stub died answers "Stub process '...' is not healthy" until tritonfront.watchdog has
reloaded it (about ten seconds). A request that got that answer before any response is sent again,
every RETRY_PAUSE_S, for up to `stream_timeout` seconds from its first try: it waits out the
restore. Sending it again is safe because nothing of it reached the client; a stream that had
already sent output fails (triton_errors.died_while_answering), since its text cannot be replayed
without repeating it. A dead llm stub's own requests never get that answer (they end at the
stream deadline), so they are never retried.
"""
import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Optional, Sequence

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from .api_errors import OpenAIError, stream_timeout
from .triton_errors import died_while_answering, from_triton, not_restored, restoring

HEALTH_TIMEOUT_S = 2.0
RETRY_PAUSE_S = 0.5
log = logging.getLogger("tritonfront.openai")
FINAL_FLAG = "triton_final_response"


@dataclass(frozen=True)
class Step:
    """One step of an ensemble: its model, and which ensemble tensor feeds each input and takes
    each output."""
    model: str
    inputs: Mapping[str, str]  # the model's input -> the ensemble's tensor
    outputs: Mapping[str, str]  # the model's output -> the ensemble's tensor


@dataclass(frozen=True)
class Contract:
    """What a served model declares: its inputs (name -> Triton datatype), outputs, batching, and
    an ensemble's steps."""
    model: str
    inputs: Mapping[str, str]
    outputs: frozenset
    max_batch_size: int
    steps: tuple = ()

    @classmethod
    def from_config(cls, model: str, config: dict) -> "Contract":
        def datatype(entry: dict) -> str:
            name = entry["data_type"].removeprefix("TYPE_")
            return "BYTES" if name == "STRING" else name
        steps = tuple(Step(step["model_name"], dict(step.get("input_map", {})), dict(step.get("output_map", {})))
                      for step in config.get("ensemble_scheduling", {}).get("step", []))
        return cls(model, {entry["name"]: datatype(entry) for entry in config.get("input", [])},
                   frozenset(entry["name"] for entry in config.get("output", [])),
                   int(config.get("max_batch_size", 0)), steps)

    def tensor(self, name: str, value: Any) -> grpcclient.InferInput:
        """One request's input: a scalar as [1, 1], a list as [1, n] (without the batch dimension when
        the model does not batch); an array as given."""
        datatype = self.inputs[name]
        if isinstance(value, np.ndarray):
            array = value
        else:
            values = value if isinstance(value, list) else [value]
            if datatype == "BYTES":
                array = np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=object)
            else:
                array = np.array(values, dtype=triton_to_np_dtype(datatype))
            if self.max_batch_size > 0:
                array = array.reshape(1, -1)
        infer_input = grpcclient.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        return infer_input

    def tensors(self, values: Mapping[str, Any]) -> list[grpcclient.InferInput]:
        return [self.tensor(name, value) for name, value in values.items()]


def is_final(result) -> bool:
    parameter = result.get_response().parameters.get(FINAL_FLAG)
    return bool(parameter.bool_param) if parameter is not None else False


class RestoreWait:
    """One request's wait for its model's restore (the module's docstring says when)."""

    def __init__(self, limit_s: float):
        self.loop = asyncio.get_running_loop()
        self.started, self.limit_s = self.loop.time(), limit_s
        self.retried = False

    async def after(self, error: OpenAIError, answered: bool = False) -> None:
        """Returns when the request that failed with `error` may be sent again; raises what its
        client gets otherwise. `answered`: the request had sent output."""
        if not restoring(error):
            raise error
        if answered:
            raise died_while_answering(error) from None
        waited = self.loop.time() - self.started
        if waited + RETRY_PAUSE_S > self.limit_s:
            raise not_restored(error, waited) from None
        if not self.retried:
            self.retried = True
            log.warning("%s: waiting up to %g s for the model's restore, sending the request again every %g s",
                        error.message, self.limit_s, RETRY_PAUSE_S)
        await asyncio.sleep(RETRY_PAUSE_S)


class TritonClient:
    def __init__(self, url: str, stream_timeout_s: float):
        self.client = grpcaio.InferenceServerClient(url)
        self.stream_timeout_s = stream_timeout_s
        self._contracts: dict[str, Contract] = {}

    async def close(self) -> None:
        await self.client.close()

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready(client_timeout=HEALTH_TIMEOUT_S))
        except InferenceServerException:
            return False

    async def model_ready(self, model: str) -> bool:
        try:
            return bool(await self.client.is_model_ready(model, client_timeout=HEALTH_TIMEOUT_S))
        except InferenceServerException:
            return False

    async def contract(self, model: str) -> Contract:
        contract = self._contracts.get(model)
        if contract is None:
            try:
                config = await self.client.get_model_config(model, as_json=True, client_timeout=HEALTH_TIMEOUT_S)
            except InferenceServerException as error:
                raise _error(error, model, {}) from None
            contract = self._contracts[model] = Contract.from_config(model, config["config"])
        return contract

    async def stream(self, contract: Contract, inputs: Sequence, outputs: Sequence[str],
                     params: Mapping[str, str]) -> AsyncIterator:
        """The responses (InferResult) of one streamed request, up to its final one, sent again
        while its model is being restored and nothing came back yet. Raises OpenAIError for
        Triton's error (`params`: the request's input -> OpenAI parameter) and when nothing arrives
        for stream_timeout_s; leaving early cancels the request."""
        restore = RestoreWait(self.stream_timeout_s)
        while True:
            answered = False
            try:
                # Closed at once when the consumer leaves: that cancels the request in Triton.
                async with contextlib.aclosing(self._stream_once(contract, inputs, outputs, params)) as responses:
                    async for result in responses:
                        answered = True
                        yield result
                return
            except OpenAIError as error:
                await restore.after(error, answered)

    async def _stream_once(self, contract: Contract, inputs: Sequence, outputs: Sequence[str],
                           params: Mapping[str, str]) -> AsyncIterator:
        done = asyncio.Event()

        async def request():
            yield {"model_name": contract.model, "inputs": list(inputs),
                   "outputs": [grpcclient.InferRequestedOutput(name) for name in outputs]}
            await done.wait()  # the stream stays open for writing until its answer is complete

        call = self.client.stream_infer(request())
        final = False  # answered whole: the stream closes by ending its requests, not by a cancel
        try:
            while True:
                try:
                    async with asyncio.timeout(self.stream_timeout_s):
                        result, error = await call.__anext__()
                except TimeoutError:
                    raise stream_timeout(contract.model, self.stream_timeout_s) from None
                except StopAsyncIteration:
                    raise OpenAIError(502, f"model '{contract.model}' ended the stream before its final response",
                                      type="server_error", code="stream_ended") from None
                except grpc.RpcError as rpc_error:
                    raise from_triton(rpc_error.details() or "", str(rpc_error.code()), contract.model,
                                      params) from None
                if error is not None:
                    raise from_triton(error.message() or str(error), error.status() or "", contract.model, params)
                yield result
                if is_final(result):
                    final = True
                    return
        finally:
            done.set()
            # A cancel right after the final response can reach Triton 2.51 while the ensemble is
            # still releasing the request, and the ensemble then stays loaded for good: the next
            # stop waited out the 30 s exit timeout (2 of 3 runs after 50 guided hf chats; 0 of 3
            # without the cancel). Only a stream left before its final response is cancelled.
            if not final:
                call.cancel()

    async def infer(self, contract: Contract, inputs: Sequence, outputs: Sequence[str],
                    params: Mapping[str, str], offset: int = 0):
        """One unary request's result, sent again while its model is being restored (as stream)."""
        restore = RestoreWait(self.stream_timeout_s)
        while True:
            try:
                return await self._infer_once(contract, inputs, outputs, params, offset)
            except OpenAIError as error:
                await restore.after(error)

    async def _infer_once(self, contract: Contract, inputs: Sequence, outputs: Sequence[str],
                          params: Mapping[str, str], offset: int):
        try:
            return await self.client.infer(contract.model, list(inputs),
                                           outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
                                           client_timeout=self.stream_timeout_s)
        except InferenceServerException as error:
            if error.status() == "StatusCode.DEADLINE_EXCEEDED":
                raise stream_timeout(contract.model, self.stream_timeout_s) from None
            raise _error(error, contract.model, params, offset) from None


def _error(error: InferenceServerException, model: str, params: Mapping[str, str], offset: int = 0) -> OpenAIError:
    return from_triton(error.message() or str(error), error.status() or "", model, params, offset)


def output(result, name: str, default: Optional[Any] = None) -> Any:
    """The first element of an output (text decoded); `default` when the response lacks it."""
    array = result.as_numpy(name)
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value.item()
