"""Medusa heads (engine/heads.py): the target's hidden states, training, the heads file and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specdec_cli.engine import heads as H
from specdec_cli.engine.drafters.pool import vocab_fingerprint
from specdec_cli.engine.model import Model
from specdec_cli.errors import ModelFileError

D, S = 16, 12


def _toy(n: int = 3000, seed: int = 0) -> tuple[H.Heads, np.ndarray, np.ndarray]:
    """Hidden states whose later tokens a linear map decides: head k's label is the argmax of h @ m_k over S tokens
    (ids 100..111), so heads that learn reach high accuracy while the zero-initialised start does not."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, D)).astype(np.float32)
    maps = rng.standard_normal((2, D, S)).astype(np.float32)
    subset = np.arange(100, 100 + S, dtype=np.int32)
    labels = np.stack([subset[np.argmax(h @ maps[k], axis=1)] for k in range(2)]).astype(np.int64)
    out = rng.standard_normal((S, D)).astype(np.float32) * 0.1
    return H.Heads.initial(2, out, subset, "fp", "toy.gguf"), h, labels


def test_labels_are_the_tokens_two_and_more_after_each_position() -> None:
    labels = H.targets_for(np.array([5, 6, 7, 8, 9]), 2)
    assert labels.tolist() == [[7, 8, 9, -1, -1], [8, 9, -1, -1, -1]]


def test_the_subset_is_the_most_frequent_tokens_first() -> None:
    assert H.choose_subset(np.array([3, 1, 3, 2, 2, 3, -1]), 2).tolist() == [3, 2]


def test_training_learns_what_the_hidden_states_decide() -> None:
    heads, h, labels = _toy()
    before = H.accuracy(heads, h[2500:], labels[:, 2500:])
    losses = H.train(heads, h[:2500], labels[:, :2500], epochs=30)
    after = H.accuracy(heads, h[2500:], labels[:, 2500:])
    assert all(a > 0.7 for a in after), (before, after, losses)
    assert all(a > b + 0.4 for a, b in zip(after, before, strict=True))


def test_a_stopped_training_keeps_every_head_as_far_along() -> None:
    heads, h, labels = _toy()
    steps: list[int] = []
    H.train(heads, h, labels, epochs=5, on_step=lambda done, total, loss: steps.append(done),
            should_stop=lambda: len(steps) >= 6)  # fmt: skip
    assert len(steps) == 6  # heads 1 and 2 in turn: three steps each
    assert heads.w[0].any() and heads.w[1].any()


def test_labels_outside_the_subset_are_left_out() -> None:
    heads, h, labels = _toy(200)
    labels[0, :] = 7  # never draftable
    H.train(heads, h, labels, epochs=1)
    assert not heads.w[0].any() and heads.w[1].any()  # nothing to learn from for head 1
    assert H.accuracy(heads, h, labels)[0] == 0.0


def test_the_heads_file_round_trips(tmp_path: Path) -> None:
    heads, h, labels = _toy(300)
    H.train(heads, h, labels, epochs=1)
    heads.settings = {"epochs": 1, "accuracy": [0.5, 0.25]}
    path = tmp_path / "heads.gguf"
    heads.save(path)
    back = H.Heads.load(path, "fp", D)
    for a, b in ((heads.w, back.w), (heads.b, back.b), (heads.out, back.out), (heads.subset, back.subset)):
        assert np.array_equal(a, b)
    assert (back.target, back.settings) == ("toy.gguf", heads.settings)
    assert back.guess(h[0], 2) == heads.guess(h[0], 2)


def test_a_foreign_or_damaged_heads_file_is_one_line(tmp_path: Path) -> None:
    heads, _, _ = _toy(10)
    path = tmp_path / "heads.gguf"
    heads.save(path)
    with pytest.raises(ModelFileError, match="another vocabulary"):
        H.Heads.load(path, "another fingerprint", D)
    with pytest.raises(ModelFileError, match="width 16, not 576"):
        H.Heads.load(path, "fp", 576)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    for bad in (cut, text, tmp_path / "missing.gguf"):
        with pytest.raises(ModelFileError) as err:
            H.Heads.load(bad, "fp", D)
        assert "\n" not in str(err.value)


def test_a_model_file_is_not_a_heads_file(smol_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a readable heads file"):
        H.Heads.load(smol_path)


def test_hidden_states_come_with_the_logits_the_target_gives_alone(smol: Model) -> None:
    """With embeddings on, every row's logits are the normal decode's bit for bit; the hidden state is what the
    output layer reads (its rows, read from the GGUF, give the logits back); the flag is off again after."""
    tokens = smol.tokenize("The quick brown fox jumps over the lazy dog. The quick", add_special=True, parse_special=False)
    smol.reset()
    alone = smol.decode(tokens, n_logits=len(tokens)).copy()
    smol.reset()
    logits, hidden = H.decode_hidden(smol, tokens)
    assert np.array_equal(logits, alone)
    subset = np.array([int(np.argmax(row)) for row in alone] + [1, 2, 3], dtype=np.int32)
    rows = H.output_rows(smol.path, subset)
    np.testing.assert_allclose(hidden @ rows.T, alone[:, subset], rtol=0, atol=0.02 * float(np.abs(alone).max()))  # Q8_0 weights, activations quantized too
    after = smol.decode([tokens[0]], n_logits=1)  # embeddings off again: one row asked, one row given
    assert after.shape == (1, smol.n_vocab)
    smol.reset()
    fp = vocab_fingerprint(smol.vocab_info().texts)
    assert H.Heads.initial(1, rows, subset, fp).guess(hidden[-1], 1)[0] in subset


def test_the_expected_run_counts_heads_right_in_a_row_from_the_first() -> None:
    heads, h, labels = _toy(4)
    guess = np.stack([heads.subset[np.argmax(heads.logits(k, h), axis=1)] for k in range(2)])
    labels = guess.copy()
    labels[0, 1] = -1  # head 1 wrong: head 2's right guess there adds nothing
    labels[1, 2] = -1  # head 1 right, head 2 wrong: one token
    assert H.expected_run(heads, h, labels) == (2 + 0 + 1 + 2) / 4
