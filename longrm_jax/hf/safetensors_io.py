"""Safetensors files: a lazily memory-mapped reader of our own, the ``safetensors`` library's writer.

Writing goes through ``safetensors.numpy.save_file`` (the format's own serializer; it takes numpy arrays of every
dtype we store, ml_dtypes' bfloat16 and float8 included). From 0.8 on it serializes straight from each array's
buffer; earlier releases first copied every tensor to ``bytes`` (twice a shard's memory), hence the version floor.

Reading stays here, on numpy + ml_dtypes, because the library's numpy reader does not cover what the loader
needs: ``safe_open(framework="numpy")`` cannot return float8 tensors (numpy has no such dtype; bfloat16 only
since recent releases), and its errors name neither the file nor the tensor. The format is simple (8-byte
little-endian header length, JSON header of ``{name: {dtype, shape, data_offsets}}`` + ``__metadata__``, raw
little-endian data), so we memory-map the file and slice lazily: reading a shard of a tensor touches only the
pages of that shard. Every header entry is validated against the file size up front, so a truncated or corrupt
file fails at open, naming the file and tensor, before anything is loaded.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

import ml_dtypes
import numpy as np
import safetensors.numpy

from longrm_jax.cli_support import InputError

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(InputError):
    """A safetensors file is truncated, corrupt or inconsistent (message names the file and tensor)."""


class SafetensorsFile:
    """Lazily memory-mapped safetensors file: ``keys()``, ``shape(name)``, ``dtype(name)``, ``read(name, index)``."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise SafetensorsError(f"{self.path}: truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise SafetensorsError(
                    f"{self.path}: corrupt or truncated safetensors file (header claims {header_len} bytes, "
                    f"file has {size})"
                )
            try:
                header = json.loads(fh.read(header_len))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise SafetensorsError(f"{self.path}: corrupt safetensors header: {exc}") from exc
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._data_start = 8 + header_len
        data_len = size - self._data_start
        self._entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            try:
                dtype = DTYPES[info["dtype"]]
                shape = tuple(int(s) for s in info["shape"])
                begin, end = (int(o) for o in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SafetensorsError(f"{self.path}: tensor {name!r}: bad header entry {info!r}") from exc
            expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if end - begin != expected or begin < 0:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r}: header offsets {begin}..{end} do not match "
                    f"shape {list(shape)} {info['dtype']}"
                )
            if end > data_len:
                raise SafetensorsError(
                    f"{self.path}: truncated safetensors file: tensor {name!r} needs bytes up to {end} of the "
                    f"data section, file has {data_len}"
                )
            self._entries[name] = (dtype, shape, begin, end)
        self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r") if size > 0 else None

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def dtype(self, name: str) -> np.dtype:
        return self._entries[name][0]

    def nbytes(self, name: str) -> int:
        _, _, begin, end = self._entries[name]
        return end - begin

    def view(self, name: str) -> np.ndarray:
        """Zero-copy memory-mapped view of the whole tensor (read lazily by the OS)."""
        dtype, shape, begin, end = self._entries[name]
        start = self._data_start + begin
        return self._mmap[start : self._data_start + end].view(dtype).reshape(shape)

    def read(self, name: str, index: tuple | None = None) -> np.ndarray:
        """A host copy of ``tensor[index]`` (the whole tensor when ``index`` is None)."""
        view = self.view(name)
        return np.array(view if index is None else view[index])


def save_file(tensors: Mapping[str, np.ndarray], path: str | os.PathLike, metadata: Mapping[str, str] | None = None):
    """Write ``tensors`` (in the given order) as a safetensors file; atomic (a temporary file, then a rename)."""
    arrays = {}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)  # the library serializes from the raw buffer: it must be dense
        if arr.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be stored in safetensors")
        arrays[name] = arr
    tmp = os.fspath(path) + ".tmp"
    safetensors.numpy.save_file(arrays, tmp, metadata=dict(metadata) if metadata else None)
    # The library creates its file 0600; give it the mode open() gives the config and tokenizer files (0644
    # under the usual umask), so another user (a serving account) can read the weights next to them.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
