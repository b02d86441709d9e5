"""A real text corpus with no download: the Python standard library's own source code.

Every Python installation carries about 2 MB of well-written English and code in its
standard library. :func:`corpus` concatenates a fixed list of those files, so the text is the
same on every machine with the same Python version. Tokens are bytes (vocabulary 256), which
matches :class:`labkit.gpt.config.GPTConfig`'s default ``vocab_size``.

Batches are int32 ``(batch, seq_len + 1)`` windows at random offsets: the model reads
``batch[:, :-1]`` and predicts ``batch[:, 1:]`` (see :func:`labkit.gpt.train.loss_fn`).
"""

from __future__ import annotations

import functools
import itertools
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Large pure-Python modules present in CPython 3.12 and later, sorted. Changing this list
# changes the corpus: keep it fixed so notebooks and tests see the same text.
STDLIB_FILES: tuple[str, ...] = (
    "argparse.py",
    "ast.py",
    "calendar.py",
    "collections/__init__.py",
    "configparser.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "doctest.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "gettext.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pickle.py",
    "pprint.py",
    "random.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "subprocess.py",
    "tarfile.py",
    "textwrap.py",
    "threading.py",
    "tokenize.py",
    "typing.py",
    "unittest/case.py",
    "urllib/parse.py",
    "uuid.py",
    "weakref.py",
)
DEFAULT_MAX_BYTES = 2**20  # 1 MiB: a few minutes of CPU training never sees it all


def stdlib_dir() -> Path:
    """Directory of this interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files() -> list[Path]:
    """The :data:`STDLIB_FILES` present here, in order; raises if the sources are missing."""
    root = stdlib_dir()
    found = [root / name for name in STDLIB_FILES if (root / name).is_file()]
    if len(found) < len(STDLIB_FILES) // 2:
        raise FileNotFoundError(
            f"only {len(found)} of {len(STDLIB_FILES)} standard library sources found under "
            f"{root}; this Python ships without .py sources (some slim or embedded builds "
            "do). Use a full CPython install, e.g. the official python:3.12 image or the "
            "venv from `make setup`"
        )
    return found


@functools.cache
def _full_corpus() -> bytes:
    return b"\n\n".join(path.read_bytes() for path in corpus_files())


def corpus(max_bytes: int | None = DEFAULT_MAX_BYTES) -> bytes:
    """The first ``max_bytes`` bytes (all if None) of the concatenated stdlib sources."""
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be positive or None, got {max_bytes}")
    text = _full_corpus()
    return text if max_bytes is None else text[:max_bytes]


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level tokens ``(n,)`` uint8 of ``text`` (str is encoded as UTF-8)."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(raw, dtype=np.uint8).copy()  # (n,)


def decode(tokens: np.ndarray | list[int]) -> str:
    """Text of byte tokens (any int dtype, values 0..255); invalid UTF-8 becomes U+FFFD."""
    arr = np.asarray(tokens)
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise ValueError(f"byte tokens must be in 0..255, got {arr.min()}..{arr.max()}")
    return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def split(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: the last ``val_fraction`` of ``tokens`` is held out, unshuffled."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    cut = len(tokens) - round(len(tokens) * val_fraction)
    if cut <= 0 or cut >= len(tokens):
        raise ValueError(f"{len(tokens)} tokens are too few to hold out {val_fraction:.0%}")
    return tokens[:cut], tokens[cut:]


def batch_at(
    tokens: np.ndarray, step: int, batch_size: int, seq_len: int, seed: int = 0
) -> np.ndarray:
    """Batch number ``step``: int32 ``(batch_size, seq_len + 1)`` windows at random offsets.

    The offsets depend only on ``(seed, step)``, so any batch can be rebuilt on its own.
    """
    if batch_size < 1 or seq_len < 1 or step < 0:
        raise ValueError(
            f"need batch_size >= 1, seq_len >= 1 and step >= 0, got {batch_size}, {seq_len}, {step}"
        )
    window = seq_len + 1
    if len(tokens) < window:
        raise ValueError(
            f"{len(tokens)} tokens are fewer than one window of seq_len + 1 = {window}"
        )
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - window + 1, size=batch_size)  # (batch,)
    idx = starts[:, None] + np.arange(window)  # (batch, seq_len + 1)
    return np.asarray(tokens)[idx].astype(np.int32)  # (batch, seq_len + 1)


def batches(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    steps: int | None = None,
    start: int = 0,
) -> Iterator[np.ndarray]:
    """:func:`batch_at` for steps ``start, start + 1, ...`` (forever if ``steps`` is None)."""
    counter = itertools.count(start) if steps is None else range(start, start + steps)
    for step in counter:
        yield batch_at(tokens, step, batch_size, seq_len, seed)
