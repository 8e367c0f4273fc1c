"""A tiny PNG decoder for tests (8-bit RGB/RGBA, non-interlaced): enough to read a Chromium screenshot.

Filters None/Sub/Up are vectorized with numpy; Average and Paeth need the reconstructed left
neighbour, so they run byte by byte in Python (a second or so for a 1280x2000 screenshot).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def read_png(path: str | Path) -> np.ndarray:
    """Decode ``path`` into a ``(height, width, channels)`` uint8 array. Raises ValueError for other PNG kinds."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        raise ValueError(f"{path}: only 8-bit RGB/RGBA non-interlaced PNGs are supported")
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:
            cur = line.copy()
        elif kind == 1:
            cur = (line.reshape(-1, bpp).astype(np.int64).cumsum(axis=0) % 256).astype(np.uint8).reshape(-1)
        elif kind == 2:
            cur = line + prev  # uint8 arithmetic wraps mod 256
        elif kind in (3, 4):
            cur = _sequential(line.tolist(), prev.tolist(), bpp, kind)
        else:
            raise ValueError(f"{path}: bad filter type {kind} on row {y}")
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)


def _sequential(line: list[int], prev: list[int], bpp: int, kind: int) -> np.ndarray:
    cur = [0] * len(line)
    for i, x in enumerate(line):
        a = cur[i - bpp] if i >= bpp else 0
        b = prev[i]
        if kind == 3:
            cur[i] = (x + ((a + b) >> 1)) & 0xFF
        else:
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (x + pred) & 0xFF
    return np.asarray(cur, dtype=np.uint8)
