"""What an engine sends the detokenizer: token streams cut into chunks, each with the context
window of ids before it (tritonfront.core.detokenization.DetokenizerChunk)."""
import random
from typing import Optional, Sequence

import numpy as np

from tritonfront.core.chunk_packing import pack
from tritonfront.core.delivery import NO_SLOT
from tritonfront.core.detokenization import DETOKENIZER_WINDOW, DetokenizerChunk

from .corpora import MULTILINGUAL


def chunk_stream(ids: list[int], sizes: list[int], empty_final: bool = False) -> list[DetokenizerChunk]:
    """The chunks an engine sends for `ids` in pieces of `sizes` (the rest in the last piece),
    each with the DETOKENIZER_WINDOW ids before it; `empty_final`: the last chunk carries no ids,
    as when generation ends on a token that is not sent (EOS, a stop word)."""
    chunks, position = [], 0
    for size in sizes:
        if position + size >= len(ids):
            break
        chunks.append(DetokenizerChunk(ids[max(0, position - DETOKENIZER_WINDOW):position],
                                       ids[position:position + size], False))
        position += size
    context = ids[max(0, position - DETOKENIZER_WINDOW):position]
    if empty_final:
        chunks.append(DetokenizerChunk(context, ids[position:], False))
        chunks.append(DetokenizerChunk(ids[max(0, len(ids) - DETOKENIZER_WINDOW):], [], True))
    else:
        chunks.append(DetokenizerChunk(context, ids[position:], True))
    return chunks


def random_streams(tokenizer, count: int, seed: int,
                   max_chunk: int = 4) -> list[tuple[list[int], list[DetokenizerChunk]]]:
    """`count` streams of mixed-language text, each with its ids and chunks of 1..max_chunk ids."""
    rng = random.Random(seed)
    streams = []
    for _ in range(count):
        text = " ".join(rng.sample(list(MULTILINGUAL.values()), rng.randint(1, 3)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        sizes = [rng.randint(1, max_chunk) for _ in ids]
        streams.append((ids, chunk_stream(ids, sizes, empty_final=rng.random() < 0.5)))
    return streams


def one_token_streams(tokenizer, count: int, tokens: int, seed: int) -> list[list[DetokenizerChunk]]:
    """`count` streams of `tokens` one-token chunks each (stream_interval 1, the heaviest load
    per token), repeating a random stream's ids to the length."""
    streams = []
    for ids, _ in random_streams(tokenizer, count, seed):
        while len(ids) < tokens:
            ids = ids + ids
        streams.append(chunk_stream(ids[:tokens], [1] * tokens))
    return streams


def streamed_in_intervals(sent_counts: list[int], completion_tokens: int, interval: int) -> bool:
    """Whether a stream's responses, by the completion_tokens each carried (tokens sent so far),
    follow the llm's stream_interval: the first token alone, then at least `interval` tokens per
    response (more when one waited for the previous one's acknowledgement), the rest in the final
    one; all `completion_tokens` in all."""
    new = [b - a for a, b in zip([0, *sent_counts], sent_counts)]
    if not new or sum(new) != completion_tokens or min(new) < 0:
        return False
    return completion_tokens == 0 or new[0] == 1 and all(n >= interval for n in new[1:-1])


def detokenizer_request(output_ids: Sequence[int], context_ids: Sequence[int] = (), final: bool = True,
                        finish_reason: Optional[str] = None, prompt_tokens: int = 0,
                        completion_tokens: Optional[int] = None, echo_ids: Sequence[int] = (),
                        delivery: Sequence[int] = (0, 0, NO_SLOT, 0), batch_index: int = 0, sequence_index: int = 0,
                        several_sequences: bool = False, check_cancelled: bool = True,
                        finish_reason_output: str = "generate", **more) -> dict:
    """A `detokenizer` request's inputs (numpy, by name) for one chunk, packed as the llm sends it
    (tritonfront.core.chunk_packing), with the other inputs given (`more`); finish_reason "length"
    on a final chunk unless told, completion_tokens the chunk's own ids unless told; how the client
    gets the finish reason: chunk_packing.FINISH_REASON_OUTPUTS."""
    if finish_reason is None:
        finish_reason = "length" if final else ""
    if completion_tokens is None:
        completion_tokens = len(output_ids)
    return {"chunk": pack(final, finish_reason, prompt_tokens, completion_tokens, batch_index, sequence_index,
                          several_sequences, check_cancelled, delivery, context_ids, echo_ids, output_ids,
                          finish_reason_output), **more}


def acknowledge(acknowledger, deliveries: np.ndarray) -> None:
    """Acknowledges decoded chunks as the detokenizer stub does once their responses were sent
    (tritonfront.core.delivery.Acknowledger)."""
    acknowledger.acknowledge_later(deliveries)
    acknowledger.flush()


def refuse(acknowledger, deliveries: np.ndarray) -> None:
    """Refuses chunks of cancelled requests, as the detokenizer stub does."""
    acknowledger.refuse_later(deliveries)
    acknowledger.flush()
