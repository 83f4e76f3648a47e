"""A real vision path for the tests, built offline: a tiny multimodal projector for the
built-in SmolLM2 (a GGUF file llama.cpp's engine loads with ``mmproj=``), and small
image files written byte by byte.

The projector is llama.cpp's ``gemma3`` kind (a SigLIP-style vision tower, average
pooling, one linear projection into the language model's embeddings), with one
transformer block of width 32 and seeded random weights: an image is resized to 56 x 56,
cut into 4 x 4 patches of 14 pixels, pooled to 2 x 2 = 4 image tokens. It sees nothing: it exists so that the
engine's whole image path (decode, preprocess, encode, project, the image's tokens in
the prompt) runs in the tests. Nothing may assert what it "sees"; the tests assert
that images are accepted, answered, and cost prompt tokens.

The GGUF file is written here (the format: a header, key-value metadata, tensor
descriptors, 32-byte aligned float32 data) rather than with the ``gguf`` package, to
keep the test environment's dependencies as they are.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

# SmolLM2-135M's embedding width: the projector's output.
SMOLLM2_EMBEDDING = 576
# The tower: width, feed-forward width, blocks, heads; images of IMAGE_SIZE pixels in
# patches of PATCH_SIZE, pooled by MERGE per side.
WIDTH, FFN, BLOCKS, HEADS = 32, 64, 1, 2
IMAGE_SIZE, PATCH_SIZE, MERGE = 56, 14, 2

_ALIGN = 32
_U32, _F32, _BOOL, _STRING, _ARRAY = 4, 6, 7, 8, 9


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value: object) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", _BOOL, value)
    if isinstance(value, int):
        return struct.pack("<II", _U32, value)
    if isinstance(value, float):
        return struct.pack("<If", _F32, value)
    if isinstance(value, str):
        return struct.pack("<I", _STRING) + _string(value)
    if isinstance(value, list) and all(isinstance(v, float) for v in value):
        return struct.pack("<IIQ", _ARRAY, _F32, len(value)) + struct.pack(
            f"<{len(value)}f", *value
        )
    raise TypeError(f"no GGUF value for {value!r}")


def write_gguf(path: Path, metadata: dict[str, object], tensors: dict[str, np.ndarray]) -> None:
    """A GGUF (version 3) file of ``metadata`` and float32 ``tensors``."""
    head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, value in metadata.items():
        head += (_string(key), _value(value))
    offset = 0
    blobs: list[bytes] = []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        dims = array.shape[::-1]  # GGUF lists the innermost dimension first
        head += (_string(name), struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, offset))
        pad = -len(data) % _ALIGN
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    header = b"".join(head)
    header += b"\0" * (-len(header) % _ALIGN)
    path.write_bytes(header + b"".join(blobs))


def write_projector(path: Path, seed: int = 0) -> Path:
    """The tiny ``gemma3`` projector for SmolLM2 at ``path``."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    metadata: dict[str, object] = {
        "general.architecture": "clip",
        "clip.projector_type": "gemma3",
        "clip.has_text_encoder": False,
        "clip.has_vision_encoder": True,
        "clip.has_llava_projector": False,
        "clip.vision.image_size": IMAGE_SIZE,
        "clip.vision.patch_size": PATCH_SIZE,
        "clip.vision.embedding_length": WIDTH,
        "clip.vision.feed_forward_length": FFN,
        "clip.vision.projection_dim": SMOLLM2_EMBEDDING,
        "clip.vision.block_count": BLOCKS,
        "clip.vision.attention.head_count": HEADS,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
        "clip.use_gelu": True,
        "clip.vision.projector.scale_factor": MERGE,
    }
    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": w(WIDTH, 3, PATCH_SIZE, PATCH_SIZE),
        "v.patch_embd.bias": w(WIDTH),
        "v.position_embd.weight": w((IMAGE_SIZE // PATCH_SIZE) ** 2, WIDTH),
    }
    for i in range(BLOCKS):
        b = f"v.blk.{i}."
        tensors |= {b + "ln1.weight": ones(WIDTH), b + "ln1.bias": w(WIDTH)}
        tensors |= {b + "ln2.weight": ones(WIDTH), b + "ln2.bias": w(WIDTH)}
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors |= {f"{b}{name}.weight": w(WIDTH, WIDTH), f"{b}{name}.bias": w(WIDTH)}
        tensors |= {b + "ffn_up.weight": w(FFN, WIDTH), b + "ffn_up.bias": w(FFN)}
        tensors |= {b + "ffn_down.weight": w(WIDTH, FFN), b + "ffn_down.bias": w(WIDTH)}
    tensors |= {
        "v.post_ln.weight": ones(WIDTH),
        "v.post_ln.bias": w(WIDTH),
        "mm.input_projection.weight": w(WIDTH, SMOLLM2_EMBEDDING),
        "mm.soft_emb_norm.weight": ones(WIDTH),
    }
    write_gguf(path, metadata, tensors)
    return path


def png(width: int = 8, height: int = 8, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A PNG image of one colour (8-bit RGB, unfiltered rows, zlib-compressed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\0" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def gif() -> bytes:
    """A 1 x 1 GIF (the classic smallest one: one black pixel)."""
    return (
        b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00"
        b"\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    )


# The first bytes of a WebP file (a RIFF container): enough for sniffing, not an image.
WEBP_HEAD = b"RIFF\x24\x00\x00\x00WEBPVP8 "
