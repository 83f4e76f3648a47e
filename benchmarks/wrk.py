"""wrk as the load generator: a Lua script posts a file-backed body and reports JSON.

The script reads the body once at start-up (``wrk.body``), so wrk writes the same bytes
on every request and the load generator does no per-request work in Lua. Its ``done``
hook prints one line, ``ZSBENCH {json}``: requests, duration, bytes, errors and latency
percentiles (for the CDF plots).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .machine import pin_prefix
from .procs import LOOPBACK

# Per-request timeout inside wrk: an 8 MiB echo at 32 connections on a slow peer can take
# seconds, and a timed-out request would silently drop out of the latency histogram.
WRK_TIMEOUT_S = 30
# wrk itself must finish within duration plus this slack, or it is killed.
WRK_SLACK_S = 30
_MARK = "ZSBENCH "
PERCENTILES = (
    1,
    5,
    10,
    20,
    25,
    30,
    40,
    50,
    60,
    70,
    75,
    80,
    90,
    95,
    97.5,
    99,
    99.5,
    99.9,
    100,
)

_LUA = """\
local f = assert(io.open({body_path}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
{headers}
local pcts = {{{pcts}}}

function done(summary, latency, requests)
  local parts = {{}}
  for _, p in ipairs(pcts) do
    parts[#parts + 1] = string.format('"%s": %d', tostring(p), latency:percentile(p))
  end
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {{"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}, ' ..
    '"latency_us": {{"mean": %f, "max": %d, "pct": {{%s}}}}}}\\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max, table.concat(parts, ", ")))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_script(path: Path, body_path: Path, headers: dict[str, str], delay_ms: int = 0) -> Path:
    """The Lua script; ``delay_ms`` > 0 adds wrk's ``delay()`` hook (a pause after every
    answer on each connection)."""
    lines = [f"wrk.headers[{_lua_str(k)}] = {_lua_str(v)}" for k, v in headers.items()]
    text = _LUA.format(
        body_path=_lua_str(str(body_path.resolve())),
        headers="\n".join(lines),
        pcts=", ".join(str(p) for p in PERCENTILES),
        mark=_MARK,
    )
    if delay_ms:
        text += f"\nfunction delay()\n  return {delay_ms}\nend\n"
    path.write_text(text)
    return path


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    bytes: int
    errors: dict[str, int]
    latency_pct_ms: dict[float, float]  # percentile -> milliseconds
    latency_mean_ms: float

    @property
    def good(self) -> int:
        """Completed requests with a 2xx/3xx status. wrk counts a non-2xx answer (a 429 or
        503 from load shedding, say) as a completed request, and its latency enters the
        histogram; throughput must not."""
        return max(0, self.requests - self.errors.get("status", 0))

    @property
    def rps(self) -> float:
        return self.good / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def run(
    script: Path,
    port: int,
    path: str,
    connections: int,
    duration_s: int,
    cpu: int | None,
    tls: bool = False,
) -> WrkResult:
    """Run wrk (one thread, pinned) for ``duration_s`` and parse its JSON line; over
    HTTPS when ``tls`` (wrk does not verify the certificate)."""
    argv = [
        *pin_prefix(cpu),
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, duration_s)}s",
        f"--timeout={WRK_TIMEOUT_S}s",
        "-s",
        str(script),
        f"{'https' if tls else 'http'}://{LOOPBACK}:{port}{path}",
    ]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=duration_s + WRK_SLACK_S, check=False
    )
    for line in out.stdout.splitlines():
        if line.startswith(_MARK):
            d = json.loads(line[len(_MARK) :])
            return WrkResult(
                requests=d["requests"],
                duration_s=d["duration_us"] / 1e6,
                bytes=d["bytes"],
                errors=d["errors"],
                latency_pct_ms={float(k): v / 1000 for k, v in d["latency_us"]["pct"].items()},
                latency_mean_ms=d["latency_us"]["mean"] / 1000,
            )
    raise RuntimeError(f"wrk gave no result (rc {out.returncode}): {out.stderr[-2000:]}")
