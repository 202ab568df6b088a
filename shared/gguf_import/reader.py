"""A small, fast reader for GGUF files (versions 2 and 3, little-endian).

`gguf.GGUFReader` builds a numpy view per array element, which takes seconds on a 49k-token
vocabulary; this reader walks the header once with `struct` and maps the tensor data lazily, so the
metadata of a whole model is read in tens of milliseconds. Dequantisation stays with `gguf.quants`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value type id -> struct format of one scalar of that type.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the contiguous (column) dimension
    ggml_type: int
    offset: int  # absolute byte offset in the file

    @property
    def torch_shape(self) -> tuple[int, ...]:
        # ggml lists dimensions innermost first; torch/numpy list them outermost first.
        return tuple(reversed(self.dims))

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"unknown ggml type {self.ggml_type}"


class GGUFFile:
    """Metadata and tensor table of one GGUF file; tensor bytes are read on demand via mmap."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view of the tensor data; the map closes when it is collected

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drop_pages(self, info: TensorInfo | None = None) -> None:
        """Takes the file pages of one tensor (None: of the whole file) out of this process's resident set.
        The data stays valid: the map is read-only, so a later read faults the pages back in from the page
        cache or the file. Used once a tensor's blocks have been copied into the kernel's tiles, so the
        file's pages and their repacked copy are not resident together."""
        start, end = (0, len(self._map)) if info is None else (info.offset, info.offset + self._nbytes(info))
        start -= start % mmap.PAGESIZE  # madvise takes page-aligned ranges; a shared edge page just faults back in
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _nbytes(self, info: TensorInfo) -> int:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        return info.dims[0] // block_size * type_size * int(np.prod(info.dims[1:], dtype=np.int64))

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes as stored, shaped (rows..., bytes per row) as `gguf.quants` expects."""
        if info.ggml_type not in GGML_QUANT_SIZES:
            raise GGUFFormatError(f"tensor {info.name!r} has {info.type_name}, whose block size is unknown")
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        if info.dims[0] % block_size:
            raise GGUFFormatError(f"tensor {info.name!r}: row length {info.dims[0]} is not a multiple of {block_size}")
        row_bytes = info.dims[0] // block_size * type_size
        n_bytes = row_bytes * int(np.prod(info.dims[1:], dtype=np.int64))
        if info.offset + n_bytes > len(self._map):
            raise GGUFFormatError(f"tensor {info.name!r} runs past the end of {self.path}")
        data = np.frombuffer(self._map, dtype=np.uint8, count=n_bytes, offset=info.offset)
        return data.reshape(*info.torch_shape[:-1], row_bytes)

    # -- parsing ---------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._map
        if buf[:4] != GGUF_MAGIC:
            raise GGUFFormatError(f"{self.path} is not a GGUF file (magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            # A big-endian file shows up here as a byte-swapped version number.
            raise GGUFFormatError(f"{self.path}: unsupported GGUF version {version} (supported: 2, 3, little-endian)")
        pos = 24
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.metadata[key], pos = self._value(vtype, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
            pos += 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            infos.append((name, tuple(int(d) for d in dims), ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-pos // alignment) * alignment
        for name, dims, ggml_type, offset in infos:
            self.tensors[name] = TensorInfo(name, dims, ggml_type, data_start + offset)

    def _string(self, pos: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", self._map, pos)
        start = pos + 8
        return self._map[start:start + length].decode("utf-8", errors="replace"), start + length

    def _value(self, vtype: int, pos: int) -> tuple[Any, int]:
        if vtype == _STRING:
            return self._string(pos)
        if vtype == _ARRAY:
            return self._array(pos)
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise GGUFFormatError(f"{self.path}: unknown metadata value type {vtype} at byte {pos}")
        (value,) = struct.unpack_from("<" + fmt, self._map, pos)
        return value, pos + struct.calcsize(fmt)

    def _array(self, pos: int) -> tuple[list, int]:
        elem_type, count = struct.unpack_from("<IQ", self._map, pos)
        pos += 12
        if elem_type == _STRING:
            out = []
            for _ in range(count):
                s, pos = self._string(pos)
                out.append(s)
            return out, pos
        if elem_type == _ARRAY:
            out = []
            for _ in range(count):
                v, pos = self._value(_ARRAY, pos)
                out.append(v)
            return out, pos
        fmt = _SCALAR_FORMATS.get(elem_type)
        if fmt is None:
            raise GGUFFormatError(f"{self.path}: unknown array element type {elem_type} at byte {pos}")
        size = struct.calcsize(fmt)
        values = np.frombuffer(self._map, dtype=np.dtype("<" + fmt), count=count, offset=pos)
        return values.tolist(), pos + size * count
