"""A PJRT plugin that wraps another: it forwards every call and logs a few of them.

The wrapper is a small C++ shared library (built with the system compiler). Its
``GetPjrtApi()`` opens the real plugin named by ``$LABKIT_PJRT_WRAPPED``, copies that
plugin's whole ``PJRT_Api`` table (so every call goes straight to the real function) and
replaces four entries with functions that append a line to ``$LABKIT_PJRT_LOG`` before
forwarding: ``PJRT_Client_Create``, ``PJRT_Client_Compile`` (which also writes the program
it receives, the StableHLO portable artifact, into ``$LABKIT_PJRT_DUMP``),
``PJRT_LoadedExecutable_Execute`` and ``PJRT_Client_BufferFromHostBuffer``. Registered with
JAX under a name of its own, it shows exactly what crosses the C API.

The struct layouts in the C++ source were written for this module from
``xla/pjrt/c/pjrt_c_api.h`` (openxla/xla, PJRT C API 0.114); the table offsets come from
:data:`labkit.runtime.pjrt_capi.FUNCTIONS`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from labkit.runtime import pjrt_capi
from labkit.runtime.pjrt import build_library

WRAPPED, LOG, DUMP = "LABKIT_PJRT_WRAPPED", "LABKIT_PJRT_LOG", "LABKIT_PJRT_DUMP"
LOGGED = (
    "PJRT_Client_Create",
    "PJRT_Client_Compile",
    "PJRT_LoadedExecutable_Execute",
    "PJRT_Client_BufferFromHostBuffer",
)

SOURCE = r"""
// A PJRT plugin that forwards every call to another plugin and logs four of them.
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

// Layouts from xla/pjrt/c/pjrt_c_api.h (openxla/xla, PJRT C API 0.114).
struct Program {
  size_t struct_size; void* extension_start;
  const char* code; size_t code_size; const char* format; size_t format_size;
};
struct CompileArgs {
  size_t struct_size; void* extension_start;
  void* client; const Program* program; const char* compile_options;
  size_t compile_options_size; void* executable;  // out
};
struct ExecuteArgs {
  size_t struct_size; void* extension_start;
  void* executable; void* options; void* argument_lists; size_t num_devices; size_t num_args;
};
typedef void* (*Fn)(void* args);  // every PJRT function: PJRT_Error* f(Args*)

static unsigned char* table = nullptr;  // our copy of the real PJRT_Api
static Fn real_create, real_compile, real_execute, real_from_host;
static std::mutex mu;
static int programs = 0;

static void log_line(const std::string& line) {
  const char* path = getenv("LABKIT_PJRT_LOG");
  if (path == nullptr) return;
  std::lock_guard<std::mutex> lock(mu);
  if (FILE* f = fopen(path, "a")) { fprintf(f, "%s\n", line.c_str()); fclose(f); }
}

static std::string dump(const Program* program) {
  const char* dir = getenv("LABKIT_PJRT_DUMP");
  if (dir == nullptr || program == nullptr) return "-";
  int n;
  { std::lock_guard<std::mutex> lock(mu); n = programs++; }
  std::string path = std::string(dir) + "/program_" + std::to_string(n) + "." +
                     std::string(program->format, program->format_size);
  if (FILE* f = fopen(path.c_str(), "wb")) {
    fwrite(program->code, 1, program->code_size, f);
    fclose(f);
    return path;
  }
  return "-";
}

static void* Create(void* args) {
  void* error = real_create(args);
  log_line("PJRT_Client_Create");
  return error;
}
static void* Compile(void* args) {
  auto* a = static_cast<CompileArgs*>(args);
  std::string path = dump(a->program);
  void* error = real_compile(args);
  char exe[32];
  snprintf(exe, sizeof exe, "%p", a->executable);
  log_line("PJRT_Client_Compile " + std::string(exe) + " " + path);
  return error;
}
static void* Execute(void* args) {
  auto* a = static_cast<ExecuteArgs*>(args);
  char line[96];
  snprintf(line, sizeof line, "PJRT_LoadedExecutable_Execute %p %zu", a->executable,
           a->num_args);
  log_line(line);
  return real_execute(args);
}
static void* FromHost(void* args) {
  log_line("PJRT_Client_BufferFromHostBuffer");
  return real_from_host(args);
}

static Fn swap(size_t offset, Fn mine) {
  Fn real;
  memcpy(&real, table + offset, sizeof real);
  memcpy(table + offset, &mine, sizeof mine);
  return real;
}

extern "C" const void* GetPjrtApi() {
  static std::once_flag once;
  static const void* api = nullptr;
  std::call_once(once, [] {
    const char* path = getenv("LABKIT_PJRT_WRAPPED");
    if (path == nullptr) {
      fprintf(stderr, "labkit wrapper: set LABKIT_PJRT_WRAPPED to the real plugin's .so\n");
      return;
    }
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    auto get = lib ? reinterpret_cast<const void* (*)()>(dlsym(lib, "GetPjrtApi")) : nullptr;
    const auto* real = get ? static_cast<const unsigned char*>(get()) : nullptr;
    if (real == nullptr) {
      fprintf(stderr, "labkit wrapper: no PJRT_Api from %s (%s)\n", path, dlerror());
      return;
    }
    size_t size;
    memcpy(&size, real, sizeof size);  // PJRT_Api.struct_size
    if (size < OFF_EXECUTE + sizeof(Fn)) {
      fprintf(stderr, "labkit wrapper: %s has a PJRT_Api of %zu bytes only\n", path, size);
      return;
    }
    table = static_cast<unsigned char*>(malloc(size));
    memcpy(table, real, size);  // every function forwards as it is ...
    real_create = swap(OFF_CREATE, Create);  // ... except these four
    real_compile = swap(OFF_COMPILE, Compile);
    real_execute = swap(OFF_EXECUTE, Execute);
    real_from_host = swap(OFF_FROM_HOST, FromHost);
    api = table;
  });
  return api;
}
"""


def offsets() -> dict[str, int]:
    """The ``-D`` defines of the wrapper: byte offsets of the four logged functions."""
    names = ("CREATE", "COMPILE", "EXECUTE", "FROM_HOST")
    return {f"OFF_{n}": pjrt_capi.offset_of(f) for n, f in zip(names, LOGGED, strict=True)}


def build(workdir: str | Path, compiler: str | None = None) -> Path:
    """Compile :data:`SOURCE` into ``workdir/liblabkit_pjrt_wrapper.so`` (about 1 s with g++)."""
    defines = [f"-D{k}={v}" for k, v in offsets().items()]
    return build_library(
        SOURCE, workdir, "labkit_pjrt_wrapper", defines, compiler, "the wrapping PJRT plugin"
    )


def environment(real: str | Path, log: str | Path, dump: str | Path) -> dict[str, str]:
    """The variables the wrapper reads: the real plugin, the log file, the dump folder."""
    return {WRAPPED: str(real), LOG: str(log), DUMP: str(dump)}


@dataclasses.dataclass(frozen=True)
class Log:
    """What the wrapper saw: calls per function, programs written, executes per executable."""

    calls: Counter[str]
    programs: list[Path]
    executes: Counter[str]  # by executable address
    compiled: list[str]  # executable addresses, in compile order


def read_log(path: str | Path) -> Log:
    """Parse the wrapper's log file."""
    calls: Counter[str] = Counter()
    programs: list[Path] = []
    executes: Counter[str] = Counter()
    compiled: list[str] = []
    lines = Path(path).read_text().splitlines() if Path(path).exists() else []
    for line in lines:
        name, *rest = line.split()
        calls[name] += 1
        if name == "PJRT_Client_Compile":
            compiled.append(rest[0])
            if rest[1] != "-":
                programs.append(Path(rest[1]))
        elif name == "PJRT_LoadedExecutable_Execute":
            executes[rest[0]] += 1
    return Log(calls, programs, executes, compiled)


# --------------------------------------------------------------------------------------
# The StableHLO portable artifact a framework hands to PJRT_Client_Compile

_MAGIC = b"ML\xefR"  # MLIR bytecode
_PRODUCER = re.compile(rb"StableHLO_v(\d+)\.(\d+)\.(\d+)")


def artifact_version(data: bytes) -> tuple[int, int, int] | None:
    """The StableHLO version a portable artifact was written for (its bytecode producer).

    ``None`` when ``data`` is not MLIR bytecode with a ``StableHLO_vX.Y.Z`` producer (for
    example StableHLO text).
    """
    if not data.startswith(_MAGIC):
        return None
    match = _PRODUCER.search(data[:64])
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def artifact_text(data: bytes) -> str:
    """StableHLO text of a portable artifact (jaxlib's MLIR bindings deserialize it)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy, stablehlo

    with ir.Context() as ctx:
        stablehlo.register_dialect(ctx)
        sdy.register_dialect(ctx)  # JAX writes Shardy's sharding attributes into the module
        return str(stablehlo.deserialize_portable_artifact(ctx, data))
