"""The stdlib corpus, byte tokens and deterministic batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from labkit.gpt import data


def test_corpus_is_stdlib_source_and_deterministic() -> None:
    text = data.corpus(200_000)
    assert len(text) == 200_000
    assert text == data.corpus(200_000)
    assert text.startswith(data.corpus_files()[0].read_bytes()[:1000])
    assert b"def " in text and b"import " in text
    full = data.corpus(None)
    assert len(full) > 1_000_000  # about 1.9 MB on CPython 3.12
    assert full.startswith(text)


def test_corpus_rejects_bad_size() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        data.corpus(0)


def test_missing_stdlib_sources_raise_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(data, "stdlib_dir", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match="standard library sources"):
        data.corpus_files()


def test_encode_decode_round_trip() -> None:
    text = "naïve λ -> ok\n"
    tokens = data.encode(text)
    assert tokens.dtype == np.uint8
    assert len(tokens) == len(text.encode("utf-8"))
    assert data.decode(tokens) == text
    assert data.decode(tokens.astype(np.int32).tolist()) == text
    assert np.array_equal(data.encode(text.encode()), tokens)


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(ValueError, match=r"0\.\.255"):
        data.decode(np.array([65, 256]))


def test_split_holds_out_the_tail() -> None:
    tokens = np.arange(100, dtype=np.uint8)
    train, val = data.split(tokens, 0.1)
    assert len(train) == 90 and len(val) == 10
    assert np.array_equal(np.concatenate([train, val]), tokens)
    with pytest.raises(ValueError, match="val_fraction"):
        data.split(tokens, 1.0)
    with pytest.raises(ValueError, match="too few"):
        data.split(tokens[:3], 0.1)


def test_batches_are_deterministic_windows() -> None:
    tokens = data.encode(data.corpus(50_000))
    first = list(data.batches(tokens, batch_size=4, seq_len=16, seed=7, steps=3))
    again = list(data.batches(tokens, batch_size=4, seq_len=16, seed=7, steps=3))
    other = next(data.batches(tokens, batch_size=4, seq_len=16, seed=8))
    assert len(first) == 3
    for a, b in zip(first, again, strict=True):
        assert a.shape == (4, 17) and a.dtype == np.int32
        assert np.array_equal(a, b)
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], other)
    # random access: batch 2 rebuilt alone, and a resumed iterator continues the sequence
    assert np.array_equal(data.batch_at(tokens, 2, 4, 16, seed=7), first[2])
    assert np.array_equal(next(data.batches(tokens, 4, 16, seed=7, start=1)), first[1])
    # every row is a contiguous window of the corpus
    haystack = tokens.tobytes()
    for row in first[0]:
        assert row.astype(np.uint8).tobytes() in haystack


def test_batches_reject_short_data() -> None:
    with pytest.raises(ValueError, match="fewer than one window"):
        data.batch_at(np.zeros(10, np.uint8), 0, batch_size=2, seq_len=10)
    with pytest.raises(ValueError, match="batch_size"):
        data.batch_at(np.zeros(100, np.uint8), 0, batch_size=0, seq_len=10)
