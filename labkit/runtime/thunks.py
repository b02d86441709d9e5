"""The runtime's side of a compiled GPU program: XLA's thunk sequence and its command buffers.

XLA:GPU turns the final, scheduled HLO into a *thunk sequence*: one thunk per kernel launch,
library call, copy or collective, in execution order. A thunk pass then folds runs of thunks
into ``kCommandBuffer`` thunks: each is recorded once as a CUDA graph and launched as one
(``xla_gpu_enable_command_buffer`` lists which kinds of commands may be recorded;
``xla_gpu_graph_min_graph_size`` how many a run needs). This happens after the HLO is final, so
the HLO text never shows command buffers; a compile with ``xla_dump_to`` writes the thunk
sequence before the passes (``*.thunk_sequence.txt``), after them
(``*.thunk_sequence_after_thunk_passes.txt``; absent when no pass changed anything, with command
buffers off for one), and each thunk's profile annotation, the HLO
name a GPU profiler reports for it (``*.thunk_metadata.txt``). A deviceless compile writes
them too: everything here reads those text files; nothing runs.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import TypedDict

__all__ = [
    "CommandBuffer",
    "Thunk",
    "ThunkDump",
    "command_buffers",
    "dump_options",
    "parse_thunk_sequence",
    "profile_annotations",
    "read_dump",
    "summary",
]

_LINE = re.compile(
    r"^(?P<indent> *)(?P<index>\d+): (?P<kind>k\w+)\s*\[(?P<edges>[^\]]*)\]\s*(?P<rest>.*)$"
)


@dataclasses.dataclass(frozen=True)
class Thunk:
    """One line of a thunk sequence.

    ``kind`` is XLA's thunk kind (``kCustomKernel``, ``kCommandBuffer``, ``kAllReduce``,
    ``kAsyncStart``...); ``name`` the kernel's name for kernel thunks (a kernel shared by several
    fusions keeps one name), else ""; ``depth`` 0 for the top-level sequence, 1 inside a
    command buffer or an async start; ``parent`` the position of the enclosing top-level thunk.
    """

    position: int  # order in the file
    index: int  # XLA's own number (command buffers print 000)
    kind: str
    name: str
    depth: int
    parent: int | None


@dataclasses.dataclass(frozen=True)
class CommandBuffer:
    """A ``kCommandBuffer`` thunk (one CUDA graph) and the commands recorded in it."""

    position: int
    commands: tuple[Thunk, ...]

    @property
    def kinds(self) -> Counter[str]:
        """How many commands of each thunk kind the graph holds."""
        return Counter(c.kind for c in self.commands)


@dataclasses.dataclass(frozen=True)
class ThunkDump:
    """The thunk files of one compiled module, read from an ``xla_dump_to`` folder."""

    before_passes: str  # *.thunk_sequence.txt
    after_passes: str | None  # *.thunk_sequence_after_thunk_passes.txt, if a pass changed it
    metadata: str  # *.thunk_metadata.txt

    @property
    def final(self) -> str:
        """The sequence the runtime executes: after the thunk passes if they changed it."""
        return self.after_passes if self.after_passes is not None else self.before_passes


def parse_thunk_sequence(text: str) -> list[Thunk]:
    """The thunks of a ``*.thunk_sequence*.txt`` dump, in order, with their nesting."""
    out: list[Thunk] = []
    parent: int | None = None
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        depth = len(m["indent"]) // 4
        kind = m["kind"]
        name = m["rest"].split()[0] if kind == "kCustomKernel" and m["rest"].split() else ""
        if depth == 0:
            parent = len(out)
        out.append(
            Thunk(len(out), int(m["index"]), kind, name, depth, None if depth == 0 else parent)
        )
    if not out and text.strip():
        raise ValueError(
            "no thunk lines found; expected lines like '001: kCustomKernel [...] name': pass the "
            "text of a *.thunk_sequence*.txt file written by xla_dump_to"
        )
    return out


def command_buffers(thunks: list[Thunk]) -> list[CommandBuffer]:
    """Each ``kCommandBuffer`` thunk with the commands nested in it."""
    return [
        CommandBuffer(t.position, tuple(c for c in thunks if c.parent == t.position and c.depth))
        for t in thunks
        if t.kind == "kCommandBuffer" and t.depth == 0
    ]


ThunkSummary = TypedDict(
    "ThunkSummary",
    {
        "top-level thunks": int,
        "command buffers": int,
        "commands in command buffers": int,
        "kernels in command buffers": int,
        "kernels outside": int,
        "outside": dict[str, int],  # kind -> count, of top-level thunks outside any graph
    },
)


def summary(thunks: list[Thunk]) -> ThunkSummary:
    """Plain numbers: top-level thunks (what the host launches one by one), command buffers,
    the commands they hold, and the kinds of top-level thunks left outside any graph."""
    top = [t for t in thunks if t.depth == 0]
    graphs = command_buffers(thunks)
    outside = Counter(t.kind for t in top if t.kind != "kCommandBuffer")
    return {
        "top-level thunks": len(top),
        "command buffers": len(graphs),
        "commands in command buffers": sum(len(g.commands) for g in graphs),
        "kernels in command buffers": sum(g.kinds["kCustomKernel"] for g in graphs),
        "kernels outside": outside["kCustomKernel"],
        "outside": dict(outside),
    }


def profile_annotations(metadata: str) -> list[str]:
    """The ``profile_annotation`` of every thunk in a ``*.thunk_metadata.txt`` dump, in order.

    These are the names a GPU profile gives to what ran (HLO instruction names, and
    ``command_buffer_N`` for a graph), so they are the names a PGLE profile can carry.
    """
    return re.findall(r'profile_annotation: "([^"]*)"', metadata)


def dump_options(folder: str | Path) -> dict[str, str]:
    """Per-compile options that make XLA write a compile's dumps, thunk files included, to
    ``folder`` (no per-pass HLO dumps); they leave the compiled program as it is."""
    return {"xla_dump_to": str(folder), "xla_dump_hlo_pass_re": "^$"}


def _one(folder: Path, suffix: str, required: bool = True) -> str | None:
    found = sorted(folder.glob(f"*{suffix}"))
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} modules' *{suffix} files in {folder}: give each compile a folder of "
            "its own (labkit.core.env.scratch_dir)"
        )
    if not found:
        if required:
            raise FileNotFoundError(
                f"no *{suffix} in {folder}: compile with "
                "labkit.runtime.thunks.dump_options(folder) for a GPU target (a CPU compile writes "
                "no GPU thunks)"
            )
        return None
    return found[0].read_text()


def read_dump(folder: str | Path) -> ThunkDump:
    """The thunk files of the one module compiled with ``dump_options(folder)``."""
    path = Path(folder)
    before = _one(path, ".thunk_sequence.txt")
    after = _one(path, ".thunk_sequence_after_thunk_passes.txt", required=False)
    metadata = _one(path, ".thunk_metadata.txt")
    assert before is not None and metadata is not None  # required=True raised otherwise
    return ThunkDump(before, after, metadata)
