"""W4: KServe V2 infer of a 4 MiB float32 tensor, binary extension vs JSON, against
FastAPI, MLServer and Triton."""

from __future__ import annotations

import json
import math

import numpy as np

from ..context import SuiteContext
from ..report import Section, Target, footer, rps, skipped, targets, times, wrk_table
from ..runner import Grid, run_grid
from ..scenarios import Case
from ..servers import BASELINE, ECHO, SUBJECT, fastapi_peer, mlserver, pytriton, zeroserve
from ._api import GROUP, GROUP_TITLE

# W4: one 4 MiB float32 tensor. JSON spells 1 Mi floats (~20 MB of text), so
# that path gets one connection and a longer window (FastAPI takes ~3 s per request).
W4_ELEMENTS = 1024 * 1024

W4_BINARY_CONNECTIONS = 8

W4_JSON_CONNECTIONS = 1

W4_JSON_MIN_S = 8


def _w4_tensor() -> np.ndarray:
    return np.random.default_rng(4).random(W4_ELEMENTS, dtype=np.float32)


def w4_cases() -> list[Case]:
    data = _w4_tensor()
    raw = data.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [W4_ELEMENTS],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "INPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()

    def check_binary(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}: {resp[:200]!r}"
        n = headers.get("inference-header-content-length")
        if n is None:
            return "no Inference-Header-Content-Length in the answer"
        if resp[int(n) :] != raw:
            return f"binary output differs ({len(resp) - int(n)} bytes)"
        return None

    json_body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [W4_ELEMENTS],
                    "data": data.tolist(),
                }
            ]
        }
    ).encode()
    probe = data[:8].tolist()

    def check_json(status: int, headers: dict[str, str], resp: bytes) -> str | None:
        if status != 200:
            return f"status {status}: {resp[:200]!r}"
        try:
            out = json.loads(resp)["outputs"][0]
        except (ValueError, KeyError, IndexError) as exc:
            return f"not a V2 answer: {exc}"
        if out.get("shape") != [W4_ELEMENTS] or len(out.get("data", [])) != W4_ELEMENTS:
            return f"output shape {out.get('shape')}"
        if not np.allclose(out["data"][:8], probe):
            return "output data differs"
        return None

    path = "/v2/models/echo/infer"
    return [
        Case(
            key="W4-binary",
            scenario="W4",
            label=f"binary 4 MiB x{W4_BINARY_CONNECTIONS}",
            kind="echo",
            path=path,
            body=header + raw,
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(header)),
            },
            connections=W4_BINARY_CONNECTIONS,
            validate=check_binary,
        ),
        Case(
            key="W4-json",
            scenario="W4",
            label=f"JSON ({len(json_body) / 1e6:.0f} MB) x{W4_JSON_CONNECTIONS}",
            kind="echo",
            path=path,
            body=json_body,
            headers={"Content-Type": "application/json"},
            connections=W4_JSON_CONNECTIONS,
            validate=check_json,
            min_duration_s=W4_JSON_MIN_S,
        ),
    ]


def w4(ctx: SuiteContext) -> Section:
    settings = ctx.settings()
    zs = zeroserve(ECHO)
    binary, js = w4_cases()
    fa, ml_srv, tri = fastapi_peer(), mlserver(), pytriton()
    # Binary: zeroserve and Triton. JSON: zeroserve, FastAPI, MLServer, Triton. One grid
    # per payload so each round interleaves every server on it.
    grid_b = run_grid([zs, tri], [binary], settings)
    grid_j = run_grid([zs, fa, ml_srv, tri], [js], settings)
    grid = Grid({**grid_b.runs, **grid_j.runs}, {**grid_b.skipped, **grid_j.skipped})
    servers = [zs, fa, ml_srv, tri]
    bin_vs_json = grid.ratio(binary.key, SUBJECT, SUBJECT, rps, case_b=js.key)
    zs_bin = grid.med(binary.key, SUBJECT, rps)
    ml = grid.med(js.key, "mlserver", rps)
    tri_bin = grid.med(binary.key, "triton", rps)
    copied = grid.copied_pct(binary.key, SUBJECT)
    goals = [
        Target("W4 binary vs JSON req/s", "≥5x", bin_vs_json, "{:.1f}x", lambda v: v >= 5),
        Target(
            "W4 binary copied bytes", "≤2% of payload in", copied, "{:.2f}%", lambda v: v <= 2.0
        ),
        Target(
            "W4 vs MLServer",
            "≥2x MLServer's req/s (zeroserve binary vs its JSON; MLServer has no binary extension)",
            zs_bin / ml if ml else math.nan,
            "{:.1f}x",
            lambda v: v >= 2,
        ),
        Target(
            "W4 vs Triton (binary)",
            "≥ Triton's req/s",
            zs_bin / tri_bin if tri_bin else math.nan,
            "{:.2f}x",
            lambda v: v >= 1.0,
        ),
    ]
    lines = [
        "### W4: KServe V2 infer, 4 MiB float32 through `echo`",
        "",
        "`POST /v2/models/echo/infer`. Binary: Triton's binary tensor extension "
        "(`Inference-Header-Content-Length`, binary output requested). JSON: 1 Mi floats "
        "as numbers. CPU ms / req: server process tree CPU time over the window. Copied: "
        "zeroserve's `zeroserve_copied_bytes_total` / `zeroserve_payload_bytes_total{in}`.",
        *footer(ctx, settings),
        "",
        *wrk_table(grid, [binary, js], servers, BASELINE),
        *targets(goals),
        "",
        "JSON against JSON (no target): zeroserve / MLServer "
        f"{times(grid.ratio(js.key, SUBJECT, 'mlserver', rps))}, zeroserve / Triton "
        f"{times(grid.ratio(js.key, SUBJECT, 'triton', rps))}.",
        *skipped(grid),
    ]
    return Section(GROUP, GROUP_TITLE, "\n".join(lines))
