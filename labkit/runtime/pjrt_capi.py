"""The PJRT C API driven by hand from Python with ctypes: a client without JAX's runtime.

A plugin's ``GetPjrtApi()`` returns a ``PJRT_Api`` struct: ``struct_size``,
``extension_start``, ``pjrt_api_version`` (24 bytes), then one function pointer per entry of
:data:`FUNCTIONS`, in that order. Every function takes one ``*_Args`` struct that starts with
``struct_size`` and ``extension_start``, and returns a ``PJRT_Error*`` (NULL on success).
The layouts below were written for this module from ``xla/pjrt/c/pjrt_c_api.h`` of
openxla/xla at PJRT C API 0.114 (the function table of 0.114 and 0.116 is the same 138
entries; fields are only ever appended, and a plugin accepts an args struct at least as
large as its own). :class:`Client` creates a client, compiles a StableHLO module (for
example ``jax.export``'s ``mlir_module_serialized``), moves inputs in, executes, reads
outputs back and destroys everything; :func:`compile_for_topology` compiles for a
compile-only device description (``PJRT_Compile``), with no client at all.

``python -m labkit.runtime.pjrt_capi run|topology ...`` does the same in a fresh process that
never imports JAX (see :func:`run_in_fresh_process`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from labkit.core.types import JSON
from labkit.runtime.pjrt import ApiVersion, PluginError

if TYPE_CHECKING:
    from ctypes import _CData  # the base of every ctypes type (typeshed's name for it)

type AttributeValue = str | int | float | bool | list[int]
"""A ``PJRT_NamedValue`` read back: a string, int64, float, bool or int64 list."""


class TraceRow(TypedDict):
    """One C API function an :class:`Api` called: how often, and the time spent in it."""

    function: str
    calls: int
    ms: float


class ProgramRun(TypedDict):
    """What :func:`run_program` returns."""

    outputs: list[np.ndarray]
    platform: str
    devices: int
    version: str  # the plugin's PJRT C API version
    attributes: dict[str, AttributeValue]
    trace: list[TraceRow]


class TopologyCompile(TypedDict):
    """What :func:`compile_for_topology` returns."""

    platform: str
    executable: str  # the executable's name
    outputs: int  # how many outputs it has
    serialized_bytes: int
    targets: list[str]  # the TARGETS its serialized form names
    version: str
    trace: list[TraceRow]


HEADER = "xla/pjrt/c/pjrt_c_api.h (openxla/xla, PJRT C API 0.114)"

# The PJRT_Api function table up to PJRT_Compile, in order (the header's _PJRT_API_STRUCT_FIELD
# lines); 138 entries at 0.116. Grouped as in the header.
_TABLE = """
Error_Destroy Error_Message Error_GetCode
Plugin_Initialize Plugin_Attributes
Event_Destroy Event_IsReady Event_Error Event_Await Event_OnReady
Client_Create Client_Destroy Client_PlatformName Client_ProcessIndex Client_PlatformVersion
Client_Devices Client_AddressableDevices Client_LookupDevice Client_LookupAddressableDevice
Client_AddressableMemories Client_Compile Client_DefaultDeviceAssignment
Client_BufferFromHostBuffer
DeviceDescription_Id DeviceDescription_ProcessIndex DeviceDescription_Attributes
DeviceDescription_Kind DeviceDescription_DebugString DeviceDescription_ToString
Device_GetDescription Device_IsAddressable Device_LocalHardwareId Device_AddressableMemories
Device_DefaultMemory Device_MemoryStats
Memory_Id Memory_Kind Memory_DebugString Memory_ToString Memory_AddressableByDevices
Executable_Destroy Executable_Name Executable_NumReplicas Executable_NumPartitions
Executable_NumOutputs Executable_SizeOfGeneratedCodeInBytes Executable_GetCostAnalysis
Executable_OutputMemoryKinds Executable_OptimizedProgram Executable_Serialize
LoadedExecutable_Destroy LoadedExecutable_GetExecutable LoadedExecutable_AddressableDevices
LoadedExecutable_Delete LoadedExecutable_IsDeleted LoadedExecutable_Execute
Executable_DeserializeAndLoad LoadedExecutable_Fingerprint
Buffer_Destroy Buffer_ElementType Buffer_Dimensions Buffer_UnpaddedDimensions
Buffer_DynamicDimensionIndices Buffer_GetMemoryLayout Buffer_OnDeviceSizeInBytes Buffer_Device
Buffer_Memory Buffer_Delete Buffer_IsDeleted Buffer_CopyToDevice Buffer_ToHostBuffer
Buffer_IsOnCpu Buffer_ReadyEvent Buffer_UnsafePointer Buffer_IncreaseExternalReferenceCount
Buffer_DecreaseExternalReferenceCount Buffer_OpaqueDeviceMemoryDataPointer
CopyToDeviceStream_Destroy CopyToDeviceStream_AddChunk CopyToDeviceStream_TotalBytes
CopyToDeviceStream_GranuleSize CopyToDeviceStream_CurrentBytes
TopologyDescription_Create TopologyDescription_Destroy TopologyDescription_PlatformName
TopologyDescription_PlatformVersion TopologyDescription_GetDeviceDescriptions
TopologyDescription_Serialize TopologyDescription_Attributes
Compile
"""
FUNCTIONS: tuple[str, ...] = tuple(f"PJRT_{name}" for name in _TABLE.split())
TABLE_OFFSET = 40  # bytes before the first function pointer: size, extension, version (24)

_P, _SIZE, _INT = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


def offset_of(function: str) -> int:
    """Byte offset of ``function``'s pointer inside ``PJRT_Api``."""
    if function not in FUNCTIONS:
        raise KeyError(
            f"{function} is not in labkit.runtime.pjrt_capi.FUNCTIONS "
            "(the table up to PJRT_Compile)"
        )
    return TABLE_OFFSET + ctypes.sizeof(_P) * FUNCTIONS.index(function)


def _args(name: str, *fields: tuple[str, type[_CData]]) -> type[ctypes.Structure]:
    """A ``PJRT_*_Args`` struct: ``struct_size``, ``extension_start``, then ``fields``."""
    base = [("struct_size", _SIZE), ("extension_start", _P)]
    return type(name, (ctypes.Structure,), {"_fields_": base + list(fields)})


class _Value(ctypes.Union):  # the anonymous union of PJRT_NamedValue
    _fields_ = [
        ("string", _P),
        ("int64", ctypes.c_int64),
        ("float", ctypes.c_float),
        ("bool", ctypes.c_bool),
    ]


NamedValue = _args(
    "PJRT_NamedValue",
    ("name", _P),
    ("name_size", _SIZE),
    ("type", _INT),
    ("value", _Value),
    ("value_size", _SIZE),
)
Program = _args(
    "PJRT_Program",
    ("code", ctypes.c_char_p),
    ("code_size", _SIZE),
    ("format", ctypes.c_char_p),
    ("format_size", _SIZE),
)
ExecuteOptions = _args(
    "PJRT_ExecuteOptions",
    ("send_callbacks", _P),
    ("recv_callbacks", _P),
    ("num_send_ops", _SIZE),
    ("num_recv_ops", _SIZE),
    ("launch_id", _INT),
    ("non_donatable_input_indices", _P),
    ("num_non_donatable_input_indices", _SIZE),
    ("context", _P),
    ("call_location", _P),
    ("num_tasks", _SIZE),
    ("task_ids", _P),
    ("incarnation_ids", _P),
    ("multi_slice_config", _P),
    ("use_major_to_minor_data_layout_for_callbacks", ctypes.c_bool),
    ("hlo_output_callbacks", _P),
    ("num_hlo_output_callbacks", _SIZE),
)

# One args struct per function this client calls; fields after struct_size/extension_start.
_FIELDS: dict[str, list[tuple[str, type[_CData]]]] = {
    "PJRT_Error_Destroy": [("error", _P)],
    "PJRT_Error_Message": [("error", _P), ("message", _P), ("message_size", _SIZE)],
    "PJRT_Error_GetCode": [("error", _P), ("code", _INT)],
    "PJRT_Plugin_Initialize": [],
    "PJRT_Plugin_Attributes": [("attributes", _P), ("num_attributes", _SIZE)],
    "PJRT_Event_Destroy": [("event", _P)],
    "PJRT_Event_Await": [("event", _P)],
    "PJRT_Client_Create": [
        ("create_options", _P),
        ("num_options", _SIZE),
        ("kv_get_callback", _P),
        ("kv_get_user_arg", _P),
        ("kv_put_callback", _P),
        ("kv_put_user_arg", _P),
        ("client", _P),
        ("kv_try_get_callback", _P),
        ("kv_try_get_user_arg", _P),
    ],
    "PJRT_Client_Destroy": [("client", _P)],
    "PJRT_Client_PlatformName": [("client", _P), ("platform_name", _P), ("size", _SIZE)],
    "PJRT_Client_PlatformVersion": [("client", _P), ("platform_version", _P), ("size", _SIZE)],
    "PJRT_Client_AddressableDevices": [("client", _P), ("devices", _P), ("num_devices", _SIZE)],
    "PJRT_Client_Compile": [
        ("client", _P),
        ("program", _P),
        ("compile_options", ctypes.c_char_p),
        ("compile_options_size", _SIZE),
        ("executable", _P),
    ],
    "PJRT_Client_BufferFromHostBuffer": [
        ("client", _P),
        ("data", _P),
        ("type", _INT),
        ("dims", _P),
        ("num_dims", _SIZE),
        ("byte_strides", _P),
        ("num_byte_strides", _SIZE),
        ("host_buffer_semantics", _INT),
        ("device", _P),
        ("memory", _P),
        ("device_layout", _P),
        ("done_with_host_buffer", _P),
        ("buffer", _P),
    ],
    "PJRT_Executable_Destroy": [("executable", _P)],
    "PJRT_Executable_Name": [("executable", _P), ("name", _P), ("name_size", _SIZE)],
    "PJRT_Executable_NumOutputs": [("executable", _P), ("num_outputs", _SIZE)],
    "PJRT_Executable_GetCostAnalysis": [
        ("executable", _P),
        ("num_properties", _SIZE),
        ("properties", _P),
    ],
    "PJRT_Executable_Serialize": [
        ("executable", _P),
        ("serialized_bytes", _P),
        ("serialized_bytes_size", _SIZE),
        ("serialized_executable", _P),
        ("serialized_executable_deleter", _P),
    ],
    "PJRT_LoadedExecutable_Destroy": [("executable", _P)],
    "PJRT_LoadedExecutable_GetExecutable": [("loaded_executable", _P), ("executable", _P)],
    "PJRT_LoadedExecutable_Execute": [
        ("executable", _P),
        ("options", _P),
        ("argument_lists", _P),
        ("num_devices", _SIZE),
        ("num_args", _SIZE),
        ("output_lists", _P),
        ("device_complete_events", _P),
        ("execute_device", _P),
    ],
    "PJRT_Buffer_Destroy": [("buffer", _P)],
    "PJRT_Buffer_ElementType": [("buffer", _P), ("type", _INT)],
    "PJRT_Buffer_Dimensions": [("buffer", _P), ("dims", _P), ("num_dims", _SIZE)],
    "PJRT_Buffer_ToHostBuffer": [
        ("src", _P),
        ("host_layout", _P),
        ("dst", _P),
        ("dst_size", _SIZE),
        ("event", _P),
    ],
    "PJRT_TopologyDescription_Create": [
        ("topology_name", ctypes.c_char_p),
        ("topology_name_size", _SIZE),
        ("create_options", _P),
        ("num_options", _SIZE),
        ("topology", _P),
    ],
    "PJRT_TopologyDescription_Destroy": [("topology", _P)],
    "PJRT_TopologyDescription_PlatformName": [("topology", _P), ("name", _P), ("size", _SIZE)],
    "PJRT_Compile": [
        ("topology", _P),
        ("program", _P),
        ("compile_options", ctypes.c_char_p),
        ("compile_options_size", _SIZE),
        ("client", _P),
        ("executable", _P),
    ],
}
ARGS: dict[str, type[ctypes.Structure]] = {
    name: _args(f"{name}_Args", *fields) for name, fields in _FIELDS.items()
}

# PJRT_Buffer_Type values (the header's enum order) for the dtypes this client moves.
BUFFER_TYPES = {
    "bool": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
}
_DTYPES = {code: np.dtype(name) for name, code in BUFFER_TYPES.items()}
ERROR_CODES = (
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND "
    "ALREADY_EXISTS PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION "
    "ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
    "UNAUTHENTICATED"
).split()
# Strings looked for in a serialized GPU executable: the GPU it targets, its GEMM kernels.
TARGETS = ("sm_90", "sm_90a", "__cublas$lt$matmul", "__triton_gemm", "triton_gemm")
_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1  # PJRT_HostBufferSemantics
_STRING, _INT64, _INT64_LIST, _FLOAT, _BOOL = range(5)  # PJRT_NamedValue_Type


class PjrtError(RuntimeError):
    """A PJRT C API call returned an error: the function, the error code and the message."""


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def compile_options(num_replicas: int = 1, num_partitions: int = 1) -> bytes:
    """A serialized ``xla.CompileOptionsProto``, written by hand (no protobuf library).

    Field 3 is ``executable_build_options`` with ``num_replicas`` (4) and ``num_partitions``
    (5); everything else keeps XLA's defaults (``xla/pjrt/proto/compile_options.proto``).
    """
    build = b"\x20" + _varint(num_replicas) + b"\x28" + _varint(num_partitions)
    return b"\x1a" + _varint(len(build)) + build


def _named_values(
    options: Mapping[str, str | int | bool],
) -> tuple[ctypes.Array[ctypes.Structure], list[ctypes.Array[ctypes.c_char]]]:
    """A ``PJRT_NamedValue`` array for ``options`` and the objects it points into."""
    array = (NamedValue * max(len(options), 1))()
    keep: list[ctypes.Array[ctypes.c_char]] = []
    for slot, (name, value) in zip(array, options.items(), strict=False):
        key = ctypes.create_string_buffer(name.encode())
        keep.append(key)
        slot.struct_size, slot.name_size = ctypes.sizeof(NamedValue), len(name.encode())
        slot.name, slot.value_size = ctypes.addressof(key), 1
        if isinstance(value, bool):
            slot.type, slot.value.bool = _BOOL, value
        elif isinstance(value, int):
            slot.type, slot.value.int64 = _INT64, value
        else:
            text = ctypes.create_string_buffer(value.encode())
            keep.append(text)
            slot.type, slot.value.string = _STRING, ctypes.addressof(text)
            slot.value_size = len(value.encode())
    return array, keep


def named_values(address: int | None, count: int) -> dict[str, AttributeValue]:
    """Read ``count`` ``PJRT_NamedValue`` s at ``address`` into a dict."""
    found: dict[str, AttributeValue] = {}
    for v in (NamedValue * count).from_address(address) if address and count else []:
        name = _string(v.name, v.name_size)
        if v.type == _STRING:
            found[name] = _string(v.value.string, v.value_size)
        elif v.type == _INT64_LIST:
            found[name] = list((ctypes.c_int64 * v.value_size).from_address(v.value.string))
        elif v.type == _FLOAT:
            found[name] = v.value.float
        else:
            found[name] = bool(v.value.bool) if v.type == _BOOL else v.value.int64
    return found


def _string(address: int | None, size: int) -> str:
    return ctypes.string_at(address, size).decode() if address else ""


class Api:
    """A plugin library opened with ctypes: its ``PJRT_Api`` table, called by name."""

    def __init__(self, library: str | Path) -> None:
        self.library = Path(library)
        if not self.library.exists():
            raise PluginError(f"PJRT plugin library {self.library} does not exist: check the path")
        lib = ctypes.CDLL(str(self.library), mode=os.RTLD_LOCAL)
        get_api = lib.GetPjrtApi
        get_api.restype = _P
        address = get_api()
        if not address:
            raise PluginError(f"GetPjrtApi() in {self.library} returned NULL")
        self.address: int = address
        self.struct_size = _SIZE.from_address(address).value
        major, minor = (_INT.from_address(address + 32 + 4 * i).value for i in range(2))
        self.version = ApiVersion(major, minor)
        self.calls: Counter[str] = Counter()  # how often each function was called
        self.seconds: dict[str, float] = {}  # and the seconds spent in it

    @property
    def num_functions(self) -> int:
        """Function pointers in this plugin's table (``(struct_size - 40) / 8``)."""
        return (self.struct_size - TABLE_OFFSET) // ctypes.sizeof(_P)

    def function(self, name: str) -> Callable[[int], int | None]:
        """The plugin's function ``name`` as a ctypes function of one pointer."""
        offset = offset_of(name)
        pointer = _P.from_address(self.address + offset).value if offset < self.struct_size else 0
        if not pointer:
            raise PluginError(
                f"{self.library.name} (PJRT C API {self.version}) has no {name}: the plugin "
                "predates it or does not implement it"
            )
        restype = None if name in ("PJRT_Error_Destroy", "PJRT_Error_Message") else _P
        return ctypes.CFUNCTYPE(restype, _P)(pointer)

    def call(self, name: str, **fields: int | bytes | None) -> ctypes.Structure:
        """Call ``name`` with its args struct filled from ``fields``; return the struct."""
        args = ARGS[name]()
        args.struct_size = ctypes.sizeof(args)
        for key, value in fields.items():
            setattr(args, key, value)
        start = time.perf_counter()
        error = self.function(name)(ctypes.addressof(args))
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        self.calls[name] += 1
        if error:
            raise PjrtError(f"{name} failed: {self.error_text(error)}")
        return args

    def error_text(self, error: int) -> str:
        """``CODE: message`` of a ``PJRT_Error*``, which is then destroyed."""
        message = ARGS["PJRT_Error_Message"](ctypes.sizeof(ARGS["PJRT_Error_Message"]), None, error)
        self.function("PJRT_Error_Message")(ctypes.addressof(message))
        code = ARGS["PJRT_Error_GetCode"](ctypes.sizeof(ARGS["PJRT_Error_GetCode"]), None, error)
        self.function("PJRT_Error_GetCode")(ctypes.addressof(code))
        text = _string(message.message, message.message_size)
        destroy = ARGS["PJRT_Error_Destroy"](ctypes.sizeof(ARGS["PJRT_Error_Destroy"]), None, error)
        self.function("PJRT_Error_Destroy")(ctypes.addressof(destroy))
        name = ERROR_CODES[code.code] if 0 <= code.code < len(ERROR_CODES) else str(code.code)
        return f"{name}: {text}"

    def initialize(self) -> None:
        """``PJRT_Plugin_Initialize``: once, before anything else."""
        self.call("PJRT_Plugin_Initialize")

    def attributes(self) -> dict[str, AttributeValue]:
        """``PJRT_Plugin_Attributes``: the plugin's key-value facts (XLA, StableHLO versions)."""
        out = self.call("PJRT_Plugin_Attributes")
        return named_values(out.attributes, out.num_attributes)

    def await_event(self, event: int | None) -> None:
        """Block on a ``PJRT_Event`` and destroy it (nothing for NULL)."""
        if event:
            try:
                self.call("PJRT_Event_Await", event=event)
            finally:
                self.call("PJRT_Event_Destroy", event=event)

    def trace(self) -> list[TraceRow]:
        """One row per function called: how often and the milliseconds spent in it."""
        return [
            {"function": name, "calls": n, "ms": round(self.seconds[name] * 1e3, 3)}
            for name, n in self.calls.most_common()
        ]


@dataclasses.dataclass
class Client:
    """A ``PJRT_Client`` of a plugin, with every handle it made destroyed on :meth:`close`."""

    api: Api
    options: Mapping[str, str | int | bool] = dataclasses.field(default_factory=dict)
    handle: int = 0
    _buffers: list[int] = dataclasses.field(default_factory=list)
    _executables: list[int] = dataclasses.field(default_factory=list)

    def __enter__(self) -> Client:
        array, keep = _named_values(self.options)
        out = self.api.call(
            "PJRT_Client_Create",
            create_options=ctypes.addressof(array),
            num_options=len(self.options),
        )
        del keep
        self.handle = out.client
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy buffers, executables and the client, in that order."""
        for buffer in self._buffers:
            self.api.call("PJRT_Buffer_Destroy", buffer=buffer)
        for executable in self._executables:
            self.api.call("PJRT_LoadedExecutable_Destroy", executable=executable)
        if self.handle:
            self.api.call("PJRT_Client_Destroy", client=self.handle)
        self._buffers, self._executables, self.handle = [], [], 0

    def platform(self) -> str:
        """``PJRT_Client_PlatformName`` and ``PlatformVersion``, as ``name (version)``."""
        name = self.api.call("PJRT_Client_PlatformName", client=self.handle)
        version = self.api.call("PJRT_Client_PlatformVersion", client=self.handle)
        return (
            f"{_string(name.platform_name, name.size)} "
            f"({_string(version.platform_version, version.size)})"
        )

    def devices(self) -> list[int]:
        """``PJRT_Client_AddressableDevices``: the device handles this process can use."""
        out = self.api.call("PJRT_Client_AddressableDevices", client=self.handle)
        return list((_P * out.num_devices).from_address(out.devices)) if out.num_devices else []

    def compile(self, code: bytes, options: bytes | None = None) -> int:
        """``PJRT_Client_Compile`` of a StableHLO module (text, bytecode or portable artifact)."""
        program = Program(ctypes.sizeof(Program), None, code, len(code), b"mlir", 4)
        opts = compile_options() if options is None else options
        out = self.api.call(
            "PJRT_Client_Compile",
            client=self.handle,
            program=ctypes.addressof(program),
            compile_options=opts,
            compile_options_size=len(opts),
        )
        self._executables.append(out.executable)
        return int(out.executable)

    def num_outputs(self, executable: int) -> int:
        """``PJRT_Executable_NumOutputs`` of a loaded executable."""
        inner = self.api.call("PJRT_LoadedExecutable_GetExecutable", loaded_executable=executable)
        try:
            return int(
                self.api.call("PJRT_Executable_NumOutputs", executable=inner.executable).num_outputs
            )
        finally:
            self.api.call("PJRT_Executable_Destroy", executable=inner.executable)

    def put(self, array: np.ndarray, device: int) -> int:
        """``PJRT_Client_BufferFromHostBuffer``: copy ``array`` to ``device``; a buffer handle."""
        host = np.ascontiguousarray(array)
        if host.dtype.name not in BUFFER_TYPES:
            raise TypeError(
                f"dtype {host.dtype} is not one this client moves ({sorted(BUFFER_TYPES)})"
            )
        dims = (ctypes.c_int64 * max(host.ndim, 1))(*host.shape)
        out = self.api.call(
            "PJRT_Client_BufferFromHostBuffer",
            client=self.handle,
            data=host.ctypes.data,
            type=BUFFER_TYPES[host.dtype.name],
            dims=ctypes.addressof(dims),
            num_dims=host.ndim,
            host_buffer_semantics=_IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
            device=device,
        )
        self._buffers.append(out.buffer)
        self.api.await_event(out.done_with_host_buffer)  # then `host` may be freed
        return int(out.buffer)

    def execute(self, executable: int, buffers: Sequence[int]) -> list[int]:
        """``PJRT_LoadedExecutable_Execute`` on one device; the output buffer handles."""
        num_outputs = self.num_outputs(executable)
        args = (_P * max(len(buffers), 1))(*buffers)
        outs = (_P * max(num_outputs, 1))()
        arg_lists, out_lists, done = (
            (_P * 1)(ctypes.addressof(args)),
            (_P * 1)(ctypes.addressof(outs)),
            (_P * 1)(),
        )
        options = ExecuteOptions()
        options.struct_size = ctypes.sizeof(ExecuteOptions)
        self.api.call(
            "PJRT_LoadedExecutable_Execute",
            executable=executable,
            options=ctypes.addressof(options),
            argument_lists=ctypes.addressof(arg_lists),
            num_devices=1,
            num_args=len(buffers),
            output_lists=ctypes.addressof(out_lists),
            device_complete_events=ctypes.addressof(done),
        )
        self.api.await_event(done[0])
        results = [int(b or 0) for b in outs[:num_outputs]]
        self._buffers.extend(results)
        return results

    def get(self, buffer: int) -> np.ndarray:
        """``PJRT_Buffer_ToHostBuffer``: a buffer's contents as a NumPy array."""
        kind = self.api.call("PJRT_Buffer_ElementType", buffer=buffer).type
        if kind not in _DTYPES:
            raise TypeError(f"PJRT_Buffer_Type {kind} is not one this client reads back")
        dims = self.api.call("PJRT_Buffer_Dimensions", buffer=buffer)
        shape = (
            tuple((ctypes.c_int64 * dims.num_dims).from_address(dims.dims)) if dims.num_dims else ()
        )
        host = np.empty(shape, _DTYPES[kind])
        out = self.api.call(
            "PJRT_Buffer_ToHostBuffer", src=buffer, dst=host.ctypes.data, dst_size=host.nbytes
        )
        self.api.await_event(out.event)
        return host


def run_program(
    library: str | Path,
    code: bytes,
    inputs: Sequence[np.ndarray],
    options: Mapping[str, str | int | bool] | None = None,
) -> ProgramRun:
    """Create a client, compile ``code``, run it once on ``inputs``, read back, destroy all.

    Returns ``{"outputs": [...], "platform", "devices", "version", "attributes", "trace"}``:
    ``trace`` lists every C API function called, with counts and milliseconds.
    """
    api = Api(library)
    api.initialize()
    attributes = api.attributes()
    with Client(api, options or {}) as client:
        platform, devices = client.platform(), client.devices()
        executable = client.compile(code)
        buffers = [client.put(x, devices[0]) for x in inputs]
        outputs = [client.get(b) for b in client.execute(executable, buffers)]
    return {
        "outputs": outputs,
        "platform": platform,
        "devices": len(devices),
        "version": str(api.version),
        "attributes": attributes,
        "trace": api.trace(),
    }


def compile_for_topology(
    library: str | Path,
    code: bytes,
    topology_options: Mapping[str, str | int | bool],
    topology_name: str = "",
) -> TopologyCompile:
    """``PJRT_TopologyDescription_Create`` then ``PJRT_Compile``: compile with no client.

    Returns the platform, the executable's name and outputs, the size of the serialized
    executable and which :data:`TARGETS` it names, and the trace; raises :class:`PjrtError`
    with the plugin's message when the plugin refuses.
    """
    api = Api(library)
    api.initialize()
    array, keep = _named_values(topology_options)
    name = topology_name.encode()
    topo = api.call(
        "PJRT_TopologyDescription_Create",
        topology_name=name,
        topology_name_size=len(name),
        create_options=ctypes.addressof(array),
        num_options=len(topology_options),
    ).topology
    del keep
    try:
        platform = api.call("PJRT_TopologyDescription_PlatformName", topology=topo)
        program = Program(ctypes.sizeof(Program), None, code, len(code), b"mlir", 4)
        opts = compile_options()
        exe = api.call(
            "PJRT_Compile",
            topology=topo,
            program=ctypes.addressof(program),
            compile_options=opts,
            compile_options_size=len(opts),
            client=None,
        ).executable
        try:
            exe_name = api.call("PJRT_Executable_Name", executable=exe)
            outputs = api.call("PJRT_Executable_NumOutputs", executable=exe).num_outputs
            serialized = _serialize(api, exe)
        finally:
            api.call("PJRT_Executable_Destroy", executable=exe)
    finally:
        api.call("PJRT_TopologyDescription_Destroy", topology=topo)
    return {
        "platform": _string(platform.name, platform.size),
        "executable": _string(exe_name.name, exe_name.name_size),
        "outputs": int(outputs),
        "serialized_bytes": len(serialized),
        "targets": sorted(t for t in TARGETS if t.encode() in serialized),
        "version": str(api.version),
        "trace": api.trace(),
    }


def _serialize(api: Api, executable: int) -> bytes:
    """A copy of ``PJRT_Executable_Serialize``'s bytes (then freed with the plugin's deleter)."""
    out = api.call("PJRT_Executable_Serialize", executable=executable)
    data = ctypes.string_at(out.serialized_bytes, out.serialized_bytes_size)
    if out.serialized_executable_deleter:
        ctypes.CFUNCTYPE(None, _P)(out.serialized_executable_deleter)(out.serialized_executable)
    return data


# --------------------------------------------------------------------------------------
# The same in a fresh process that never imports JAX


def run_in_fresh_process(
    command: str,
    library: str | Path,
    code: bytes,
    inputs: Sequence[np.ndarray] = (),
    options: Mapping[str, str | int | bool] | None = None,
    timeout_s: float = 300,
    env: Mapping[str, str] | None = None,
) -> dict[str, JSON | list[np.ndarray]]:
    """``run`` (:func:`run_program`) or ``topology`` (:func:`compile_for_topology`) in a child.

    The child imports ctypes, NumPy and this module only (it reports whether ``jax`` was
    ever imported); the files passed to it live in a temporary folder removed afterwards.
    """
    if command not in ("run", "topology"):
        raise ValueError(f"command must be 'run' or 'topology', got {command!r}")
    with tempfile.TemporaryDirectory(prefix="labkit-capi-") as tmp:
        folder = Path(tmp)
        (folder / "program.mlir").write_bytes(code)
        np.savez(folder / "inputs.npz", *inputs)
        (folder / "options.json").write_text(json.dumps(dict(options or {})))
        run = subprocess.run(
            [sys.executable, "-m", "labkit.runtime.pjrt_capi", command, str(library), str(folder)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )
        lines = run.stdout.strip().splitlines()
        if run.returncode != 0 or not lines:
            raise PjrtError(
                f"the C API child failed (exit {run.returncode}):\n{run.stderr[-2000:]}"
            )
        result: dict[str, JSON | list[np.ndarray]] = json.loads(lines[-1])
        if command == "run" and result["error"] is None:
            with np.load(folder / "outputs.npz") as saved:
                result["outputs"] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return result


def _child(argv: Sequence[str]) -> int:
    """Child side of :func:`run_in_fresh_process`: ``run|topology LIBRARY FOLDER``."""
    command, library, folder = argv[0], argv[1], Path(argv[2])
    code = (folder / "program.mlir").read_bytes()
    options = json.loads((folder / "options.json").read_text())
    result: dict[str, object]
    try:
        if command == "run":
            with np.load(folder / "inputs.npz") as saved:
                inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
            run = run_program(library, code, inputs, options)
            np.savez(folder / "outputs.npz", *run["outputs"])
            result = {k: v for k, v in run.items() if k != "outputs"}
        else:
            result = dict(compile_for_topology(library, code, options))
        result["error"] = None
    except (PjrtError, PluginError) as exc:
        result = {"error": str(exc)}
    result["jax_imported"] = "jax" in sys.modules
    print(json.dumps(result))
    return 0


def calls(trace: Sequence[TraceRow]) -> dict[str, int]:
    """``{function: calls}`` of a trace, without the ``PJRT_`` prefix."""
    return {row["function"].removeprefix("PJRT_"): int(row["calls"]) for row in trace}


def walk(trace: Sequence[TraceRow]) -> Iterator[str]:
    """Lines ``function  calls  ms`` of a trace, for printing."""
    width = max((len(row["function"]) for row in trace), default=10)
    for row in trace:
        yield f"{row['function']:<{width}}  {row['calls']:>3}  {row['ms']:>9.3f} ms"


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("run", "topology"):
        sys.exit("usage: python -m labkit.runtime.pjrt_capi run|topology LIBRARY FOLDER")
    sys.exit(_child(sys.argv[1:]))
