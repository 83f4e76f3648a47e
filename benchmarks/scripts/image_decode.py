"""A 4 MiB image in a ``data:`` URI, from the request body to the llama.cpp engine's
request (docs/decisions/0032-images-stay-base64.md): what zeroserve allocates and
copies on the way, against a naive decode (the URL as a ``str``, decoded to ``bytes``,
encoded again for the engine).

Run: ``.venv/bin/python -m benchmarks.scripts.image_decode [--mib 4] [--rounds 5] [--json]``;
the ``images`` suite (``python -m benchmarks --suites images``) runs it in a process of
its own, pinned to the server CPU, and reports it beside a real server's memory.

Both paths start from the same request body (bytes, as the server's arena holds it) and
end with the same engine request (``bytes``: what ``xllamacpp`` takes). Measured per
path, in this process: the peak of memory allocated beyond the body (``tracemalloc``),
the bytes the path copies (zeroserve's own ``copied_bytes`` counters; the naive path's
copies summed by hand), and the CPU time (best of ``--rounds``). The engine's own work
(llama.cpp decodes the base64 text in C++) is the same for both and is not run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgspec

from zeroserve import metrics
from zeroserve.app.backends.llamacpp import wire
from zeroserve.app.chat import ChatRequest
from zeroserve.app.limits import ApiLimits
from zeroserve.app.openai.chat import ChatCompletions

MiB = 1 << 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def body_of(image: bytes) -> bytes:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return msgspec.json.encode(
        {
            "model": "eye",
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ],
        }
    )


def zeroserve_path(body: bytes, front: ChatCompletions) -> bytes:
    """The server's path: the body decoded as a view, the image checked in place, the
    engine's request built with the base64 text copied once into it."""
    chat: ChatRequest = front.parse(memoryview(body))
    assert chat.messages is not None
    messages = [wire.message(m) for m in chat.messages]
    return wire.chat_body(chat, "eye", messages, None, {})


def naive_path(body: bytes, front: Any = None) -> bytes:
    """What a buffered server does: the URL a ``str``, the image ``bytes``, encoded
    again for the engine, the engine's request encoded from Python objects."""
    req = msgspec.json.decode(body)
    part = req["messages"][0]["content"][1]
    url: str = part["image_url"]["url"]
    header, _, text = url.partition(",")
    image = base64.b64decode(text, validate=True)
    if not image.startswith(PNG_MAGIC):
        raise ValueError("not a PNG")
    part["image_url"]["url"] = header + "," + base64.b64encode(image).decode()
    out: bytes = msgspec.json.encode({"model": "eye", **req})
    return out


def naive_copies(body: bytes) -> int:
    """The payload bytes the naive path writes: the URL str, the decoded image, its
    re-encoded text, the new URL str, the engine's request."""
    text = len(body)  # about the URL's size: the body is almost all image
    image = (text * 3) // 4
    return text + image + text + text + text


def measure(
    path: Callable[[bytes, Any], bytes], body: bytes, front: Any, rounds: int
) -> dict[str, float]:
    path(body, front)  # warm: decoders built, code paths taken
    tracemalloc.start()
    out = path(body, front)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del out
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        path(body, front)
        best = min(best, time.process_time() - t)
    return {"peak_mib": peak / MiB, "cpu_ms": best * 1e3}


SITES = ("engine_body", "engine_body_splice", "image_unescape", "image_base64")


def copied_by_site() -> dict[str, float]:
    return {site: float(metrics.copied_bytes(site)) for site in SITES}


def run(mib: float, rounds: int) -> dict[str, Any]:
    """Both paths on a ``mib`` MiB image: sizes in MiB, CPU in ms (best of ``rounds``),
    and zeroserve's copies by site (MiB)."""
    image = PNG_MAGIC + os.urandom(int(mib * MiB) - len(PNG_MAGIC))
    body = body_of(image)
    limits = ApiLimits(image_bytes=len(image))
    front = ChatCompletions(limits)
    start = copied_by_site()
    engine_body = zeroserve_path(body, front)
    metrics.count_copy("engine_body", len(engine_body))  # counted by the backend's start
    sites = {k: (v - start[k]) / MiB for k, v in copied_by_site().items() if v != start[k]}
    ours = measure(zeroserve_path, body, front, rounds)
    naive = measure(naive_path, body, None, rounds)
    return {
        "image_mib": len(image) / MiB,
        "body_mib": len(body) / MiB,
        "rounds": rounds,
        "zeroserve": {**ours, "copied_mib": sum(sites.values()), "sites": sites},
        "naive": {**naive, "copied_mib": naive_copies(body) / MiB},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=4.0, help="image size in MiB (default 4)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    got = run(args.mib, args.rounds)
    if args.json:
        print(json.dumps(got))
        return 0
    ours, naive = got["zeroserve"], got["naive"]
    print(f"image {got['image_mib']:.1f} MiB, body {got['body_mib']:.2f} MiB (base64 text)")
    print("| path | peak allocated beyond the body, MiB | payload bytes copied, MiB | CPU ms |")
    print("|---|---|---|---|")
    sites = ", ".join(f"{k}={v:.2f}" for k, v in sorted(ours["sites"].items()))
    print(
        f"| zeroserve | {ours['peak_mib']:.2f} | {ours['copied_mib']:.2f} ({sites}) | "
        f"{ours['cpu_ms']:.2f} |"
    )
    print(
        f"| naive | {naive['peak_mib']:.2f} | {naive['copied_mib']:.2f} (by hand) | "
        f"{naive['cpu_ms']:.2f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
