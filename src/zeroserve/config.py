"""One configuration, built from defaults < TOML file < ``ZEROSERVE_*`` env < CLI flags.

TOML layout (every key optional)::

    host = "127.0.0.1"
    port = 8000
    workers = 1                 # HTTP processes (SO_REUSEPORT)
    loop = "auto"               # auto | uvloop | asyncio
    loop_rt_priority = 0        # 1-99: the event loop thread real-time (SCHED_RR), 0 off
    arena_bytes = 1073741824    # payload bytes in flight (503 beyond)
    models = ["echo", "mine=my_model:MyModel?executor=process"]
    default_models = true       # serve the embedded models when no model is given
    models_dir = "/srv/models"  # a catalog of models loaded at run time (NAME.gguf,
                                # NAME/model.toml); no default models with it
    keep_alive_s = 300          # unload a --models-dir model idle this long
    models_max = 4              # at most this many --models-dir models loaded at once
    models_memory = 8589934592  # at most this many bytes of loaded models (measured)
    autoload = true             # a request loads the --models-dir model it names
    serve_cache = true          # the pull cache's models join the catalog (default: on
                                # with models_dir or --allow-pull, with workers = 1)
    log_level = "info"
    ui = true                   # the playground and dashboard page at /
    data_dir = "/var/lib/zeroserve"  # the Files and Batch APIs' state (off when unset)

    [limits]   # max_head_bytes, max_headers, max_uri_bytes, max_body_bytes
    [timeouts] # head, body, keepalive, write, graceful, drain_ready_delay (seconds)
    [runtime]  # the engine's RuntimeOptions: default_deadline_s (--request-timeout),
               # hang_grace_s, channel_capacity, coalesce_cap_bytes, queue_depth,
               # load_timeout_s, shutdown_timeout_s, restart_backoff_s,
               # max_restart_backoff_s, inline_yield_every,
               # ray_address (the Ray cluster of executor=ray models),
               # model_nice (--model-nice: models' work below the event loop),
               # priority_aging_s (seconds of waiting worth one priority class; 0: FIFO)
    [api_limits] # embedding_inputs, messages, prompts, stop, tools, n, generations,
                 # output_tokens, v2_inputs, v2_outputs, v2_output_bytes, images,
                 # image_bytes (app/limits.py)
    [edge]     # api_keys, api_keys_file, auth_metrics, cors_origins,
               # cors_allow_credentials, access_log, request_ids, tracing
    [tls]      # certfile, keyfile, ca_certs (client certificates: mTLS)
    [batch]    # the Batch API's limits: max_file_bytes, max_lines, max_line_bytes,
               # max_open_batches (per key), min_free_bytes, lines_per_model,
               # lines_queued (app/batch/options.py)
    [images]   # allow_urls (hosts chat images may be fetched from; none: off),
               # allow_loopback_urls (unsafe: tests), fetch_timeout_s (docs/images.md)

Environment variables use the key in upper case, nested keys joined by ``__``:
``ZEROSERVE_PORT=9000``, ``ZEROSERVE_LIMITS__MAX_BODY_BYTES=1048576``,
``ZEROSERVE_MODELS="echo,mine=my_model:MyModel"``, ``ZEROSERVE_RUNTIME__QUEUE_DEPTH=8``.
``ZEROSERVE_API_KEY`` adds one API key (``edge.api_keys``). Errors name the key at fault,
and never show an API key. The environment is shared with other programs, so a
``ZEROSERVE_*`` variable that names no key is not an error: it gets a
:class:`~zeroserve.errors.ConfigWarning` naming it, and is ignored.
"""

from __future__ import annotations

import os
import tomllib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from .app.backends.images import FETCH_TIMEOUT_S, ImageFetchPolicy
from .app.batch import BatchOptions
from .app.batch.options import (
    LINES_PER_MODEL,
    LINES_QUEUED,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_LINES,
    MAX_OPEN_BATCHES,
    MIN_FREE_BYTES,
)
from .app.limits import ApiLimits
from .edge import ApiKey, EdgeOptions, KeyRing, load_keys_file
from .edge.cors import CorsPolicy
from .errors import ConfigError, ConfigWarning
from .http.limits import MAX_BODY_BYTES, MAX_HEAD_BYTES, MAX_HEADERS, MAX_URI_BYTES, HttpLimits
from .runtime import RuntimeOptions
from .runtime.arena import DEFAULT_BUDGET_BYTES
from .runtime.classes import check_priority
from .runtime.model_manager import DEFAULT_KEEP_ALIVE_S
from .runtime.priority import MAX_NICE, MAX_RT_PRIORITY
from .server import options as so

ENV_PREFIX = "ZEROSERVE_"
# Variables under the prefix that are not configuration (process plumbing, test switches).
# ZEROSERVE_PURE picks the build at import (buildinfo.PURE_ENV), not a configuration key.
# Variables read elsewhere, not configuration keys: the pull cache's (models/cache.py,
# models/pull.py), the build's and the tests'.
_NOT_CONFIG = tuple(
    ENV_PREFIX + name for name in ("INTERNAL_", "TEST_", "PURE", "CACHE", "PULL_ALLOW_HTTP")
)
# Variables named for what users expect rather than by the nesting rule.
_ENV_ALIASES = {ENV_PREFIX + "API_KEY": ("edge", "api_keys")}
# Keys whose environment value is a comma-separated list.
_LIST_KEYS = frozenset({"models", "cors_origins", "api_keys", "allow_urls"})


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS
    max_uri_bytes: int = MAX_URI_BYTES
    max_body_bytes: int = MAX_BODY_BYTES


class Timeouts(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    head: float = so.HEAD_TIMEOUT_S
    body: float = so.BODY_TIMEOUT_S
    keepalive: float = so.KEEPALIVE_TIMEOUT_S
    write: float = so.WRITE_TIMEOUT_S
    graceful: float = so.GRACEFUL_TIMEOUT_S
    drain_ready_delay: float = so.DRAIN_READY_DELAY_S


class EdgeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The edge (docs/architecture.md, "The edge"); every field off by default."""

    api_keys: list[str] = []
    api_keys_file: str | None = None
    auth_metrics: bool = False
    cors_origins: list[str] = []
    cors_allow_credentials: bool = False
    access_log: str | None = None
    request_ids: bool = True
    tracing: bool = False  # OpenTelemetry spans, exported over OTLP ([otel] extra)

    def options(self) -> EdgeOptions:
        keys: list[ApiKey] = []
        single = len(self.api_keys) == 1
        for i, secret in enumerate(self.api_keys, 1):
            try:
                encoded = secret.encode("ascii")
            except UnicodeEncodeError:
                raise ConfigError(f"key 'edge.api_keys': entry {i} is not ASCII") from None
            keys.append(ApiKey("default" if single else f"key-{i}", encoded))
        try:
            if self.api_keys_file:
                keys += load_keys_file(self.api_keys_file)
            # Validated here so a bad combination fails at startup, naming the key.
            if self.cors_origins:
                CorsPolicy(self.cors_origins, allow_credentials=self.cors_allow_credentials)
            if keys:
                KeyRing(keys)
            for key in keys:  # the classes a key names are the runtime's
                for fld, value in (("priority", key.priority), ("priority_min", key.priority_min)):
                    if value is not None:
                        check_priority(value, f"[keys.{key.name}] {fld}")
        except ValueError as exc:
            raise ConfigError(f"key 'edge': {exc}") from None
        return EdgeOptions(
            keys=tuple(keys),
            auth_metrics=self.auth_metrics,
            cors_origins=tuple(self.cors_origins),
            cors_allow_credentials=self.cors_allow_credentials,
            access_log=self.access_log,
            request_ids=self.request_ids,
            tracing=self.tracing,
        )


class BatchConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The Batch API's limits (app/batch/options.py); used with ``data_dir``."""

    max_file_bytes: int = MAX_FILE_BYTES
    max_lines: int = MAX_LINES
    max_line_bytes: int = MAX_LINE_BYTES
    max_open_batches: int = MAX_OPEN_BATCHES
    min_free_bytes: int = MIN_FREE_BYTES
    lines_per_model: int = LINES_PER_MODEL
    lines_queued: int = LINES_QUEUED


class Tls(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    certfile: str | None = None
    keyfile: str | None = None
    ca_certs: str | None = None

    def options(self) -> so.TlsOptions | None:
        if self.certfile is None:
            if self.keyfile or self.ca_certs:
                raise ConfigError("key 'tls.certfile': required with tls.keyfile / tls.ca_certs")
            return None
        return so.TlsOptions(certfile=self.certfile, keyfile=self.keyfile, ca_certs=self.ca_certs)


_API_LIMITS = ApiLimits()


class ApiLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    embedding_inputs: int = _API_LIMITS.embedding_inputs
    messages: int = _API_LIMITS.messages
    prompts: int = _API_LIMITS.prompts
    stop: int = _API_LIMITS.stop
    tools: int = _API_LIMITS.tools
    n: int = _API_LIMITS.n
    generations: int = _API_LIMITS.generations
    output_tokens: int = _API_LIMITS.output_tokens
    v2_inputs: int = _API_LIMITS.v2_inputs
    v2_outputs: int = _API_LIMITS.v2_outputs
    v2_output_bytes: int = _API_LIMITS.v2_output_bytes
    images: int = _API_LIMITS.images
    image_bytes: int = _API_LIMITS.image_bytes


_RUNTIME_DEFAULTS = RuntimeOptions()


class Runtime(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``[runtime]`` section: :class:`~zeroserve.runtime.RuntimeOptions` field by field
    (their constants say why each default is what it is)."""

    default_deadline_s: float = _RUNTIME_DEFAULTS.default_deadline_s
    channel_capacity: int = _RUNTIME_DEFAULTS.channel_capacity
    coalesce_cap_bytes: int = _RUNTIME_DEFAULTS.coalesce_cap_bytes
    queue_depth: int = _RUNTIME_DEFAULTS.queue_depth
    load_timeout_s: float = _RUNTIME_DEFAULTS.load_timeout_s
    shutdown_timeout_s: float = _RUNTIME_DEFAULTS.shutdown_timeout_s
    restart_backoff_s: float = _RUNTIME_DEFAULTS.restart_backoff_s
    max_restart_backoff_s: float = _RUNTIME_DEFAULTS.max_restart_backoff_s
    inline_yield_every: int = _RUNTIME_DEFAULTS.inline_yield_every
    ray_address: str | None = _RUNTIME_DEFAULTS.ray_address
    hang_grace_s: float = _RUNTIME_DEFAULTS.hang_grace_s
    model_nice: int = _RUNTIME_DEFAULTS.model_nice
    priority_aging_s: float = _RUNTIME_DEFAULTS.priority_aging_s


class Images(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``[images]`` section: remote chat images (docs/images.md). ``allow_urls``:
    the hosts images may be fetched from (none: remote image URLs are refused);
    ``allow_loopback_urls``: loopback addresses too (unsafe: for tests)."""

    allow_urls: list[str] = []
    allow_loopback_urls: bool = False
    fetch_timeout_s: float = FETCH_TIMEOUT_S


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # The event loop thread's real-time priority (runtime/priority.py, raise_loop); 0: off.
    loop_rt_priority: int = 0
    arena_bytes: int = DEFAULT_BUDGET_BYTES
    max_connections: int = so.MAX_CONNECTIONS
    models: list[str] = []
    default_models: bool = True
    # Models at run time (docs/architecture.md, "Models at run time").
    models_dir: str | None = None
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    models_max: int | None = None
    models_memory: int | None = None  # bytes (docs/models.md, "Memory")
    autoload: bool | None = None  # None: on with models_dir
    serve_cache: bool | None = None  # None: on with models_dir or --allow-pull, workers = 1
    log_level: str = "info"
    ui: bool = True
    # Where the Files and Batch APIs keep their SQLite database and files; unset: no
    # /v1/files nor /v1/batches (docs/architecture.md, "The Batch API").
    data_dir: str | None = None
    limits: Limits = msgspec.field(default_factory=Limits)
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    runtime: Runtime = msgspec.field(default_factory=Runtime)
    api_limits: ApiLimitsConfig = msgspec.field(default_factory=ApiLimitsConfig)
    edge: EdgeConfig = msgspec.field(default_factory=EdgeConfig)
    tls: Tls = msgspec.field(default_factory=Tls)
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)

    @property
    def autoloads(self) -> bool:
        """Whether a request loads the model it names: on by default with models_dir."""
        return self.autoload if self.autoload is not None else self.models_dir is not None

    def serves_cache(self, allow_pull: bool) -> bool:
        """Whether the pull cache's models join the catalog (docs/models.md, "Pulled models
        in the catalog"): by default with models_dir or ``--allow-pull``, one HTTP process."""
        if self.serve_cache is not None:
            return self.serve_cache
        return (self.models_dir is not None or allow_pull) and self.workers == 1

    images: Images = msgspec.field(default_factory=Images)

    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions(**msgspec.structs.asdict(self.runtime))

    def batch_options(self) -> BatchOptions | None:
        if self.data_dir is None:
            return None
        return BatchOptions(Path(self.data_dir), **msgspec.structs.asdict(self.batch))

    def app_limits(self) -> ApiLimits:
        return ApiLimits(**msgspec.structs.asdict(self.api_limits))

    def image_fetch(self) -> ImageFetchPolicy | None:
        """Where chat images may be fetched from (None: nowhere)."""
        hosts = frozenset(h.strip().lower() for h in self.images.allow_urls if h.strip())
        if not hosts:
            return None
        return ImageFetchPolicy(
            hosts,
            max_bytes=self.api_limits.image_bytes,
            timeout_s=self.images.fetch_timeout_s,
            allow_loopback=self.images.allow_loopback_urls,
        )

    def http_limits(self) -> HttpLimits:
        lim = self.limits
        return HttpLimits(
            max_head_bytes=lim.max_head_bytes,
            max_headers=lim.max_headers,
            max_uri_bytes=lim.max_uri_bytes,
            max_body_bytes=lim.max_body_bytes,
        )

    def server_options(self) -> so.ServerOptions:
        t = self.timeouts
        return so.ServerOptions(
            host=self.host,
            port=self.port,
            http=self.http_limits(),
            head_timeout=t.head,
            body_timeout=t.body,
            keepalive_timeout=t.keepalive,
            write_timeout=t.write,
            graceful_timeout=t.graceful,
            max_connections=self.max_connections,
            reuse_port=self.workers > 1,
            drain_ready_delay=t.drain_ready_delay,
            tls=self.tls.options(),
        )


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Merge the layers and validate. Raises ``ConfigError`` naming the offending key."""
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    _merge(data, _from_env(os.environ if env is None else env))
    _merge(data, {k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        cfg = msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_name_key(str(exc))}") from None
    for key in ("default_deadline_s", "hang_grace_s"):
        value = msgspec.structs.asdict(cfg.runtime)[key]
        if not 0 < value < float("inf"):
            raise ConfigError(f"invalid configuration: key 'runtime.{key}': must be > 0 seconds")
    for key, value in msgspec.structs.asdict(cfg.batch).items():
        if value < (0 if key in ("min_free_bytes", "lines_queued") else 1):
            raise ConfigError(f"invalid configuration: key 'batch.{key}': must be positive")
    if not 0 <= cfg.loop_rt_priority <= MAX_RT_PRIORITY:
        raise ConfigError(
            f"invalid configuration: key 'loop_rt_priority': must be 0 to {MAX_RT_PRIORITY}"
        )
    if not 0 <= cfg.keep_alive_s < float("inf"):
        raise ConfigError("invalid configuration: key 'keep_alive_s': must be >= 0 seconds")
    if cfg.models_max is not None and cfg.models_max < 1:
        raise ConfigError("invalid configuration: key 'models_max': must be at least 1")
    if cfg.models_memory is not None and cfg.models_memory < 1:
        raise ConfigError("invalid configuration: key 'models_memory': must be at least 1 byte")
    if cfg.models_dir is not None and cfg.workers > 1:
        raise ConfigError(
            "invalid configuration: key 'models_dir': needs workers = 1 (each HTTP process "
            "would load its own copy of every model, and a load would reach only one)"
        )
    if cfg.serve_cache and cfg.workers > 1:
        raise ConfigError(
            "invalid configuration: key 'serve_cache': needs workers = 1 (each HTTP process "
            "would load its own copy of every cached model, and a load would reach only one)"
        )
    if not 0 <= cfg.runtime.priority_aging_s < float("inf"):
        raise ConfigError(
            "invalid configuration: key 'runtime.priority_aging_s': must be >= 0 seconds"
        )
    if not 0 <= cfg.runtime.model_nice <= MAX_NICE:
        raise ConfigError(
            f"invalid configuration: key 'runtime.model_nice': must be 0 to {MAX_NICE}"
        )
    if not 0 < cfg.images.fetch_timeout_s < float("inf"):
        raise ConfigError(
            "invalid configuration: key 'images.fetch_timeout_s': must be > 0 seconds"
        )
    try:
        cfg.app_limits()
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    return cfg


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key.startswith(_NOT_CONFIG):
            continue
        alias = _ENV_ALIASES.get(key)
        if alias is not None:
            section, leaf = alias
            out.setdefault(section, {}).setdefault(leaf, []).append(value)
            continue
        parts = key[len(ENV_PREFIX) :].lower().split("__")
        if not _is_key(parts):
            unknown.append(key)
            continue
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        leaf = parts[-1]
        node[leaf] = [s for s in value.split(",") if s] if leaf in _LIST_KEYS else value
    if unknown:
        warnings.warn(
            f"ignoring environment variables that name no configuration key: "
            f"{', '.join(sorted(unknown))}",
            ConfigWarning,
            stacklevel=3,
        )
    return out


def _is_key(parts: list[str]) -> bool:
    """Whether ``parts`` (``["limits", "max_body_bytes"]``) name a leaf of ``Config``."""
    node: Any = Config
    for part in parts:
        if not (isinstance(node, type) and issubclass(node, msgspec.Struct)):
            return False
        fields = {f.name: f.type for f in msgspec.structs.fields(node)}
        if part not in fields:
            return False
        node = fields[part]
    return not (isinstance(node, type) and issubclass(node, msgspec.Struct))


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _name_key(message: str) -> str:
    # msgspec says "... - at `$.limits.max_body_bytes`"; say it as a config key.
    if "- at `$." in message:
        text, _, where = message.rpartition(" - at `$.")
        return f"key '{where.rstrip('`')}': {text}"
    return message
