"""The ragged pooler against per-sequence references: a plain loop over each sequence, and
sentence-transformers' own modules on the padded batch."""
import json
import math
import warnings

import numpy as np
import pytest
import torch

from harness.fresh_python import last_line
from tritonfront.core import model_sources, padding
from tritonfront.core.encoding import RaggedEncoder
from tritonfront.errors import InvalidInput
from tritonfront.core.pooling import POOLING_MODES, DenseLayer, PoolingHead, pool, pooling_modes, truncate_dimensions
from tritonfront.core.ragged import RaggedBatch
from tritonfront.core.tokenization import BatchTokenizer, TextRequest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

HIDDEN = 384
MODE_TUPLES = [(mode,) for mode in POOLING_MODES] + [("cls", "mean"), ("mean", "max", "lasttoken"),
                                                     ("weightedmean", "mean_sqrt_len_tokens")]


def random_batch(seed: int, hidden: int = HIDDEN) -> list[np.ndarray]:
    # Lengths 1 (every mode degenerates to the one token) up to a few hundred, in random order.
    rng = np.random.default_rng(seed)
    lengths = [1, *rng.integers(1, 300, size=int(rng.integers(2, 12)))]
    rng.shuffle(lengths)
    return [rng.normal(size=(n, hidden)).astype(np.float32) * rng.uniform(0.1, 10) for n in lengths]


def reference_pool(sequence: torch.Tensor, mode: str) -> torch.Tensor:
    n = len(sequence)
    if mode == "mean":
        return sequence.mean(0)
    if mode == "cls":
        return sequence[0]
    if mode == "lasttoken":
        return sequence[-1]
    if mode == "max":
        return sequence.max(0).values
    if mode == "mean_sqrt_len_tokens":
        return sequence.sum(0) / math.sqrt(n)
    if mode == "weightedmean":
        weights = torch.arange(1, n + 1, dtype=sequence.dtype)
        return (sequence * weights[:, None]).sum(0) / weights.sum()
    raise AssertionError(mode)


def reference_head(vector: torch.Tensor, dense, normalized) -> torch.Tensor:
    for layer in dense:
        vector = layer.activation(layer.weight @ vector + (0 if layer.bias is None else layer.bias))
    return torch.nn.functional.normalize(vector, dim=0) if normalized else vector


def dense_heads(kind: str, modes) -> list[DenseLayer]:
    generator = torch.Generator().manual_seed(7)
    width = HIDDEN * len(modes)
    if kind == "none":
        return []
    if kind == "tanh":
        return [DenseLayer(torch.randn(128, width, generator=generator) / width ** 0.5,
                           torch.randn(128, generator=generator), torch.tanh)]
    # Two layers, the second without bias: the projection order and the missing bias both matter.
    return [DenseLayer(torch.randn(256, width, generator=generator) / width ** 0.5,
                       torch.randn(256, generator=generator), torch.nn.Identity()),
            DenseLayer(torch.randn(64, 256, generator=generator) / 16, None, torch.tanh)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("modes", MODE_TUPLES, ids="+".join)
def test_pool_equals_per_sequence_reference(seed, modes):
    sequences = random_batch(seed)
    batch = RaggedBatch.concat(sequences)
    for mode in modes:
        expected = torch.stack([reference_pool(torch.from_numpy(s), mode) for s in sequences])
        torch.testing.assert_close(pool(batch, mode), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("modes", MODE_TUPLES, ids="+".join)
def test_pool_equals_sentence_transformers_pooling_on_padded_batch(modes):
    sequences = random_batch(11)
    longest = max(len(s) for s in sequences)
    padded = torch.zeros(len(sequences), longest, HIDDEN)
    mask = torch.zeros(len(sequences), longest, dtype=torch.long)
    for i, s in enumerate(sequences):
        padded[i, : len(s)] = torch.from_numpy(s)
        mask[i, : len(s)] = 1
    st_pooling = Pooling(HIDDEN, modes if len(modes) > 1 else modes[0])
    expected = st_pooling({"token_embeddings": padded, "attention_mask": mask})["sentence_embedding"]
    ours = PoolingHead(modes=modes, hidden_size=HIDDEN).sentence_embeddings(RaggedBatch.concat(sequences))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dense", ["none", "tanh", "identity+tanh"])
@pytest.mark.parametrize("modes", [("mean",), ("cls", "max"), ("lasttoken",), ("weightedmean",)], ids="+".join)
def test_sentence_embeddings_equal_reference(modes, dense, normalized):
    sequences = random_batch(3)
    head = PoolingHead(modes=modes, dense=dense_heads(dense, modes), normalized=normalized, hidden_size=HIDDEN)
    ours = head.sentence_embeddings(RaggedBatch.concat(sequences))
    expected = torch.stack([
        reference_head(torch.cat([reference_pool(torch.from_numpy(s), mode) for mode in modes]), head.dense, normalized)
        for s in sequences])
    assert ours.shape == (len(sequences), head.sentence_dim)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    for dimensions in (1, 17, head.sentence_dim - 1, head.sentence_dim):
        truncated = truncate_dimensions(ours, dimensions, renormalize=normalized)
        reference = expected[:, :dimensions]
        if normalized:
            reference = torch.nn.functional.normalize(reference, dim=1)
        torch.testing.assert_close(truncated, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dense", ["none", "tanh", "identity+tanh"])
def test_token_embeddings_are_every_token_projected_then_normalized(dense, normalized):
    # The documented meaning of token_embeddings: the head's Dense layers and Normalize applied
    # to each token, as if each token were its own sentence.
    sequences = random_batch(5)
    head = PoolingHead(modes=("mean",), dense=dense_heads(dense, ("mean",)), normalized=normalized, hidden_size=HIDDEN)
    batch = RaggedBatch.concat(sequences)
    rows = batch.split(head.token_embeddings(batch))
    for sequence, ours in zip(sequences, rows):
        tokens = torch.from_numpy(sequence)
        expected = torch.stack([reference_head(token, head.dense, normalized) for token in tokens])
        assert ours.shape == (len(sequence), head.token_dim)
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
        for dimensions in (5, head.token_dim):
            reference = expected[:, :dimensions]
            if normalized:
                reference = torch.nn.functional.normalize(reference, dim=1)
            torch.testing.assert_close(truncate_dimensions(ours, dimensions, normalized), reference, rtol=1e-4, atol=1e-4)


def test_dimensions_limits_name_the_field_and_range():
    head = PoolingHead(modes=("mean",), hidden_size=HIDDEN)
    for bad in (0, -1, HIDDEN + 1):
        with pytest.raises(InvalidInput, match=rf"^dimensions: {bad} is outside 1\.\.{HIDDEN} "):
            head.check_dimensions(bad, head.sentence_dim)
    for good in (None, 1, HIDDEN):
        head.check_dimensions(good, head.sentence_dim)


def test_each_request_of_a_batch_gets_its_own_outputs_and_dimensions():
    head = PoolingHead(modes=("cls",), dense=dense_heads("tanh", ("cls",)), normalized=True, hidden_size=HIDDEN)
    sequences = random_batch(3)
    states = padding.pad(sequences[:3])
    lengths = np.array([[len(s)] for s in sequences[:3]], dtype=np.int32)
    requests = [head.parse({"token_states": states, "input_lengths": lengths}),
                head.parse({"token_states": states, "input_lengths": lengths, "dimensions": np.array([[16]] * 3, dtype=np.int32)},
                           ["embedding", "token_embeddings"]),
                head.parse({"token_states": states[:1], "input_lengths": lengths[:1]}, ["token_embeddings"])]
    full, cut, tokens_only = head.pool_requests(requests)
    assert set(full) == {"embedding"} and set(cut) == {"embedding", "token_embeddings"} and set(tokens_only) == {"token_embeddings"}
    batch = RaggedBatch.concat(sequences[:3])
    expected = head.sentence_embeddings(batch)
    np.testing.assert_allclose(full["embedding"], expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(cut["embedding"], truncate_dimensions(expected, 16).numpy(), atol=1e-5)
    assert cut["token_embeddings"].shape == (3, states.shape[1], 16)
    first_tokens = head.token_embeddings(RaggedBatch.concat(sequences[:1])).numpy()
    np.testing.assert_allclose(tokens_only["token_embeddings"][0, :len(sequences[0])], first_tokens, atol=1e-5)
    with pytest.raises(InvalidInput, match=r"^dimensions: 200 is outside 1\.\.128 for this model$"):
        head.parse({"token_states": states, "input_lengths": lengths, "dimensions": np.array([[200]] * 3, dtype=np.int32)})


def test_bundled_model_head_is_mean_and_normalized():
    head = PoolingHead.from_folder(model_sources.embed_model_dir(), HIDDEN)
    assert head.modes == ("mean",) and head.normalized and head.dense == []
    assert head.sentence_dim == head.token_dim == HIDDEN


def test_plain_hugging_face_folder_gets_sentence_transformers_default(tmp_path):
    head = PoolingHead.from_folder(tmp_path, 64)
    assert head.modes == ("mean",) and not head.normalized and head.dense == []


@pytest.fixture(scope="module")
def dense_model_dir(tmp_path_factory):
    """The bundled MiniLM with a multi-mode Pooling, a Tanh Dense projection to 128 and Normalize,
    saved by sentence-transformers itself."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("minilm_dense")
    modules = [Transformer(str(model_sources.embed_model_dir()), max_seq_length=256),
               Pooling(HIDDEN, ("cls", "mean")), Dense(2 * HIDDEN, 128), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def test_from_folder_reads_dense_and_normalize(dense_model_dir):
    head = PoolingHead.from_folder(dense_model_dir, HIDDEN)
    reference = SentenceTransformer(str(dense_model_dir), device="cpu")
    assert head.modes == ("cls", "mean") and head.normalized and len(head.dense) == 1
    assert head.sentence_dim == head.token_dim == 128
    torch.testing.assert_close(head.dense[0].weight, reference[2].linear.weight.detach())
    torch.testing.assert_close(head.dense[0].bias, reference[2].linear.bias.detach())
    assert isinstance(head.dense[0].activation, torch.nn.Tanh)


def test_library_pipeline_equals_sentence_transformers_encode(dense_model_dir):
    texts = ["a", "", "Dense heads project the pooled vector.", "naïve café 東京 🎉", "token " * 400,
             "short", "Two sentences. Of different length, in one batch!"]
    tokenizer = BatchTokenizer.from_folder(dense_model_dir)
    encoder = RaggedEncoder.from_folder(dense_model_dir)
    head = PoolingHead.from_folder(dense_model_dir, encoder.hidden_size)
    tokenized = tokenizer.encode_requests([TextRequest(texts)])[0]
    states = encoder.encode(encoder.split_sequences(tokenized.input_ids, tokenized.input_lengths))
    ours = head.sentence_embeddings(RaggedBatch.concat(states)).numpy()
    expected = SentenceTransformer(str(dense_model_dir), device="cpu").encode(texts)
    assert ours.shape == expected.shape == (len(texts), 128)
    np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_the_encoder_refuses_id_lists_over_its_limit_naming_the_row(dense_model_dir):
    """embed_ids hands the encoder ids no tokenizer truncated: a list over the limit is the client's
    error, not a failure deep in the model that would fail every request of the batch."""
    encoder = RaggedEncoder.from_folder(dense_model_dir, max_length=8)
    ids = np.array([[101, 7592, 102] + [0] * 6, [101] + [7592] * 7 + [102]], dtype=np.int32)
    with pytest.raises(InvalidInput, match=r"^input_ids\[1\]: 9 token ids is over the model limit of 8$"):
        encoder.split_sequences(ids, np.array([[3], [9]], dtype=np.int32))
    assert [len(seq) for seq in encoder.split_sequences(ids, np.array([[3], [8]], dtype=np.int32))] == [3, 8]
    assert RaggedEncoder.from_folder(dense_model_dir).max_length == encoder.model.config.max_position_embeddings


def write_head(folder, modules):
    """A modules.json with a Transformer entry and the given (kind, module) after it; the head
    reads only the modules after the Transformer."""
    entries = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    for idx, (kind, module) in enumerate(modules, start=1):
        (folder / f"{idx}_{kind}").mkdir()
        module.save(str(folder / f"{idx}_{kind}"))
        entries.append({"idx": idx, "name": str(idx), "path": f"{idx}_{kind}", "type": f"sentence_transformers.models.{kind}"})
    (folder / "modules.json").write_text(json.dumps(entries))


@pytest.mark.parametrize("modules, problem", [
    ([("Dense", Dense(HIDDEN, HIDDEN, module_input_name="token_embeddings")), ("Pooling", Pooling(HIDDEN))],
     "Dense from token_embeddings"),
    ([("Pooling", Pooling(HIDDEN)), ("Normalize", Normalize()), ("Dense", Dense(HIDDEN, 32))],
     "Dense module after Normalize"),
    ([("Pooling", Pooling(HIDDEN)), ("Dense", Dense(HIDDEN, 32, use_residual=True))], "residual"),
], ids=["token-level-dense", "dense-after-normalize", "residual-dense"])
def test_heads_that_would_not_match_sentence_transformers_are_refused(tmp_path, modules, problem):
    write_head(tmp_path, modules)
    with pytest.raises(ValueError, match=problem):
        PoolingHead.from_folder(tmp_path, HIDDEN)


@pytest.mark.parametrize("config", [
    {"word_embedding_dimension": 4, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True},
    {"word_embedding_dimension": 4, "pooling_mode_lasttoken": True, "pooling_mode_cls_token": True,
     "pooling_mode_max_tokens": True},
    {"word_embedding_dimension": 4, "pooling_mode_mean_tokens": False},
    {"embedding_dimension": 4, "pooling_mode": "weightedmean"},
    {"embedding_dimension": 4, "pooling_mode": ["max", "mean_sqrt_len_tokens"]},
    {"embedding_dimension": 4}], ids=["legacy", "legacy-several", "legacy-none-set", "one", "list", "default"])
def test_pooling_modes_are_read_as_sentence_transformers_reads_them(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    mode = Pooling.load(str(tmp_path)).pooling_mode
    assert pooling_modes(tmp_path) == ((mode,) if isinstance(mode, str) else tuple(mode))


def test_a_head_without_dense_layers_loads_without_sentence_transformers():
    code = ("import sys\n"
            "from tritonfront.core import model_sources\n"
            "from tritonfront.core.pooling import PoolingHead\n"
            "head = PoolingHead.for_model(model_sources.model_dir('embed'))\n"
            "print(head.modes, head.normalized, 'sentence_transformers' in sys.modules, 'transformers' in sys.modules)\n")
    assert last_line(code, timeout=120) == "('mean',) True False False"
