"""ipywidgets front ends. Thin: each displays what a plain, tested function returns.

:func:`flag_explorer` lets a learner pick XLA flags, recompile the kit's GPT step for 8 H100s
and read what changed (:func:`flag_diff`). Creating it compiles nothing; the button does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from labkit import collectives
from labkit.flags import compile_options

# label -> XLA_FLAGS token; disable_async picks are merged into one list
CHOICES: dict[str, str] = {
    "latency-hiding scheduler off": "--xla_gpu_enable_latency_hiding_scheduler=false",
    "all-reduce synchronous": "--xla_gpu_disable_async_collectives=ALLREDUCE",
    "all-gather synchronous": "--xla_gpu_disable_async_collectives=ALLGATHER",
    "reduce-scatter synchronous": "--xla_gpu_disable_async_collectives=REDUCESCATTER",
    "analytical latency estimator": "--xla_gpu_enable_analytical_latency_estimator=true",
}
DEFAULT = -1  # slider value for "leave the threshold unset"
THRESHOLDS: list[tuple[str, int]] = [("default", DEFAULT), ("0", 0)] + [
    (f"{n >> 10} KiB" if n < 1 << 20 else f"{n >> 20} MiB", n)
    for n in (1 << k for k in range(10, 26, 2))
]


@dataclasses.dataclass(frozen=True)
class FlagDiff:
    """A recompile with ``flags`` against the default program, summarized."""

    flags: tuple[str, ...]
    options: dict[str, str | bool | int]
    diff: dict[str, tuple[int, int]]
    identical: bool

    def table(self) -> str:
        """The changed metrics as a markdown table, or a plain 'no change' line."""
        from labkit.report import markdown_table

        if self.identical:
            return "No change: the compiled program is identical to the default one."
        rows = collectives.diff_rows(self.diff)
        if not rows:
            return "Same counts, bytes and overlap; the program text differs elsewhere."
        return markdown_table(rows, ["metric", "before", "after"])


def flag_tokens(selected: Sequence[str], threshold: int | None, strategy: str = "dp") -> list[str]:
    """XLA_FLAGS tokens for picked ``CHOICES`` labels and a combine threshold (None: default)."""
    unknown = [s for s in selected if s not in CHOICES]
    if unknown:
        raise ValueError(f"unknown choices {unknown}; pick from {list(CHOICES)}")
    tokens, disabled = [], []
    for label in selected:
        name, _, value = CHOICES[label].partition("=")
        if name == "--xla_gpu_disable_async_collectives":
            disabled.append(value)
        else:
            tokens.append(CHOICES[label])
    if disabled:
        tokens.append("--xla_gpu_disable_async_collectives=" + ",".join(disabled))
    if threshold is not None:
        tokens += [f"--{name}={int(threshold)}" for name in collectives.THRESHOLD_FLAGS[strategy]]
    return tokens


def flag_diff(
    selected: Sequence[str],
    threshold: int | None = None,
    strategy: str = "dp",
    preset: str = "tiny",
    batch_size: int = 32,
    compile_fn: Callable[..., Any] | None = None,
) -> FlagDiff:
    """Compile the step with and without the picked flags (per compile) and diff the HLO."""
    compile_fn = compile_fn or collectives.compile_step
    tokens = flag_tokens(selected, threshold, strategy)
    options = compile_options(tokens) if tokens else {}
    before = compile_fn(preset, strategy, {}, batch_size=batch_size).hlo
    after = compile_fn(preset, strategy, options, batch_size=batch_size).hlo
    d = collectives.diff(before, after)
    return FlagDiff(tuple(tokens), options, d, collectives.identical(before, after))


def flag_explorer(
    strategy: str = "dp",
    preset: str = "tiny",
    batch_size: int = 32,
    compile_fn: Callable[..., Any] | None = None,
) -> Any:
    """Checkboxes, a threshold slider and a button; a click recompiles and shows the diff."""
    import ipywidgets as w
    from IPython.display import Markdown, display

    boxes = [w.Checkbox(value=False, description=label, indent=False) for label in CHOICES]
    slider = w.SelectionSlider(options=THRESHOLDS, value=DEFAULT, description="threshold")
    button = w.Button(description="recompile", button_style="primary")
    out = w.Output()

    def run(_: Any) -> None:
        picked = [b.description for b in boxes if b.value]
        with out:
            out.clear_output()
            print(f"compiling the {strategy} step for 8 H100s...")
            threshold = None if slider.value == DEFAULT else slider.value
            result = flag_diff(picked, threshold, strategy, preset, batch_size, compile_fn)
            out.clear_output()
            print(" ".join(result.flags) or "(no flags: the default program)")
            display(Markdown(result.table()))

    button.on_click(run)
    return w.VBox([*boxes, slider, button, out])
