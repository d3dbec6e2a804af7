"""What an engine sends the detokenizer, shared by its tests and perf/bench_detokenizer.py:
multilingual token streams cut into chunks with their context windows, as Triton inputs."""
import random
from typing import Optional

import numpy as np

from tritonfront.detokenization import DETOKENIZER_WINDOW, Chunk

TEXTS = {
    "emoji": "Family 👨‍👩‍👧‍👦, flag 🏳️‍🌈 and 🇯🇵, thumbs 👍🏽👍🏿, party 🎉🎉🎉 done 🫠",
    "cjk": "日本語のテキストです。你好，世界！한국어 문장도 있어요",
    "accents": "Ça va? Très bien, merci. naïve café résumé, e\u0301 combining, Ελληνικά и кириллица",
    "mixed": "def f(x):\n    return x ** 2  # 平方 ✓\n\nprint(f(3))  → 9 …",
    "whitespace": "one\n\n\ntwo    three\t\t four  \n  \n\tfive   six\n seven  eight   nine\n\n\n\nten,  eleven\r\n twelve.   ",
}


def chunk_stream(ids: list[int], sizes: list[int], empty_final: bool = False) -> list[Chunk]:
    """The chunks an engine sends for `ids` in pieces of `sizes` (the rest in the last piece),
    each with the DETOKENIZER_WINDOW ids before it; `empty_final`: the last chunk carries no ids,
    as when generation ends on a token that is not sent (EOS, a stop word)."""
    chunks, position = [], 0
    for size in sizes:
        if position + size >= len(ids):
            break
        chunks.append(Chunk(ids[max(0, position - DETOKENIZER_WINDOW):position], ids[position:position + size], False))
        position += size
    context = ids[max(0, position - DETOKENIZER_WINDOW):position]
    if empty_final:
        chunks.append(Chunk(context, ids[position:], False))
        chunks.append(Chunk(ids[max(0, len(ids) - DETOKENIZER_WINDOW):], [], True))
    else:
        chunks.append(Chunk(context, ids[position:], True))
    return chunks


def random_streams(tokenizer, count: int, seed: int, max_chunk: int = 4) -> list[tuple[list[int], list[Chunk]]]:
    """`count` streams of mixed-language text, each with its ids and chunks of 1..max_chunk ids."""
    rng = random.Random(seed)
    streams = []
    for _ in range(count):
        text = " ".join(rng.sample(list(TEXTS.values()), rng.randint(1, 3)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        sizes = [rng.randint(1, max_chunk) for _ in ids]
        streams.append((ids, chunk_stream(ids, sizes, empty_final=rng.random() < 0.5)))
    return streams


def infer_inputs(chunk: Chunk, prompt_tokens: int, completion_tokens: int, finish_reason: Optional[str] = None):
    """gRPC inputs of one detokenizer request ([1, n]-shaped, as the engine's responses are)."""
    import tritonclient.grpc as grpcclient

    if finish_reason is None:
        finish_reason = "length" if chunk.is_final else ""
    tensors = {
        "output_ids": np.array([chunk.output_ids], dtype=np.int32).reshape(1, -1),
        "context_ids": np.array([chunk.context_ids], dtype=np.int32).reshape(1, -1),
        "is_final": np.array([[chunk.is_final]], dtype=bool),
        "finish_reason": np.array([[finish_reason.encode()]], dtype=np.object_),
        "prompt_tokens": np.array([[prompt_tokens]], dtype=np.int32),
        "completion_tokens": np.array([[completion_tokens]], dtype=np.int32),
    }
    inputs = []
    for name, value in tensors.items():
        tensor = grpcclient.InferInput(name, list(value.shape), {np.int32: "INT32", np.bool_: "BOOL", np.object_: "BYTES"}[value.dtype.type])
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs
