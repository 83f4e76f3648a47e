"""The ``zeroserve`` command: ``serve``, ``models``, ``bench``, and the cache: ``pull``, ``list``, ``rm``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__, buildinfo
from .config import Config, load_config
from .errors import ConfigError, ConfigWarning, ZeroserveError
from .loadgen import add_arguments as add_loadgen_arguments
from .loadgen import main as loadgen_main
from .models.cache import cache_dir
from .models.catalog import CatalogEntry, server_catalog
from .models.loader import BACKENDS, BUILTINS, ModelRef, parse_spec
from .models.pull import spec_from_pull

log = logging.getLogger("zeroserve")

DEFAULT_MODELS = ("echo", "tinyllm", "minilm", "smollm2")

# Each command's help ends with examples (tests/docs/test_guidance.py parses every one of
# them with this parser, so they stay true).
MAIN_EXAMPLES = """\
examples:
  zeroserve serve                       serve the default models on http://127.0.0.1:8000
  zeroserve serve --model 'chat=llamacpp:/path/model.gguf?n_ctx=8192'
  zeroserve models                      list what that would serve, with capabilities
  zeroserve bench http://127.0.0.1:8000 --stream -c 8 -n 200

Each command's --help has more. A running server describes its API at GET /openapi.json
and answers the openai SDK at base_url http://127.0.0.1:8000/v1.
"""
SERVE_EXAMPLES = """\
examples:
  zeroserve serve                                 echo, tinyllm, minilm and smollm2
  zeroserve serve --model 'chat=llamacpp:/path/model.gguf?n_ctx=8192&parallel=4'
  zeroserve serve --model emb=onnx:/path/model.onnx
  zeroserve serve --model mine=my_model:MyModel    a zeroserve.Model in ./my_model.py
  zeroserve serve --host 0.0.0.0 --api-keys-file keys.toml --access-log -
  zeroserve serve --models-dir ./models --keep-alive 10m --models-max 2
  zeroserve serve --allow-pull --model 'chat=hf:ORG/REPO:FILE.gguf?n_ctx=4096'

Then: curl http://127.0.0.1:8000/v1/models, or the openai SDK with
base_url="http://127.0.0.1:8000/v1". The page at / is a playground and live dashboard.
"""
MODELS_EXAMPLES = """\
examples:
  zeroserve models                                the default models
  zeroserve models --model mine=my_model:MyModel --model echo
  zeroserve models --models-dir ./models          the catalog a --models-dir server has
  zeroserve models --url http://127.0.0.1:8000    a running server's catalog and states
"""


class _Version(argparse.Action):
    """``--version``: the version and which build runs, compiled modules or pure Python
    (docs/decisions/0007-compiled-build.md); computed only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        sys.stdout.write(f"zeroserve {__version__} ({buildinfo.describe()})\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zeroserve",
        description="A zero-copy Python AI-inference server (OpenAI, KServe V2 and raw APIs).",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version, help="show the version and build, then exit")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve models over HTTP",
        description=(
            "Serve models over HTTP/1.1. With no --model, serves the default models: echo\n"
            "(the identity), tinyllm (a demo generative model), minilm (all-MiniLM-L6-v2\n"
            "embeddings) and smollm2 (SmolLM2-135M-Instruct chat on llama.cpp's engine).\n"
            "Configuration: defaults < --config TOML < ZEROSERVE_* environment < flags."
        ),
        epilog=SERVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(serve)
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, help="port to listen on (default 8000; 0 = any free port)"
    )
    serve.add_argument(
        "--workers", type=int, help="HTTP worker processes sharing the port (default 1)"
    )
    serve.add_argument(
        "--loop",
        choices=["auto", "uvloop", "asyncio"],
        help="event loop (default auto: uvloop if installed)",
    )
    serve.add_argument(
        "--loop-rt-priority",
        type=int,
        metavar="N",
        help="run the event loop thread real-time (SCHED_RR) at priority N, 1 to 99, so a "
        "model sharing its core never delays it (needs CAP_SYS_NICE or ulimit -r N; "
        "default 0: off; models stay normal threads)",
    )
    serve.add_argument(
        "--max-body-bytes", type=int, help="largest request body accepted (413 beyond)"
    )
    serve.add_argument("--arena-bytes", type=int, help="payload bytes in flight before 503")
    serve.add_argument(
        "--queue-depth", type=int, help="admitted requests per model before 429 (default 64)"
    )
    serve.add_argument(
        "--ray-address",
        help="Ray cluster for executor=ray models (default: RAY_ADDRESS, else "
        "a local Ray started and stopped by zeroserve)",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        metavar="SECONDS",
        help="longest a request may live, queueing and execution (default 300; 504 beyond); "
        "a model's deadline_s option and a request's own timeout can only shorten it",
    )
    serve.add_argument(
        "--model-nice",
        type=int,
        metavar="N",
        help="nice levels below the HTTP event loop that models' threads and worker "
        "processes run at, 0 to 19 (default 10; 0: the same priority); a model's nice "
        "option overrides it",
    )
    serve.add_argument(
        "--data-dir",
        metavar="DIR",
        help="serve OpenAI's Files and Batch APIs (/v1/files, /v1/batches), keeping their "
        "SQLite database and files in DIR; batches survive a restart and resume "
        "(default: off; with --workers N the workers share DIR, and one runs each batch)",
    )
    serve.add_argument("--log-level", help="debug, info, warning, error")
    run_time = serve.add_argument_group(
        "models at run time",
        "a catalog of models loaded and unloaded while the server runs: on a request "
        "(autoload), by POST /models/load and /models/unload, or the KServe V2 repository "
        "routes (admin only); SIGHUP or POST /v2/repository/index rescans the directory "
        "and the cache",
    )
    run_time.add_argument(
        "--models-dir",
        metavar="DIR",
        help="serve the models in DIR: each NAME.gguf (llama.cpp) and NAME/model.toml "
        "(spec, pin, [options]); none is loaded at start, and no default model is served "
        "unless given with --model (a --model is loaded at start and stays)",
    )
    run_time.add_argument(
        "--keep-alive",
        type=_duration,
        metavar="DURATION",
        help="unload a --models-dir model after it has been idle this long (nothing in "
        "flight, no stream open): seconds, or with a unit: 90s, 5m, 1h (default 5m)",
    )
    run_time.add_argument(
        "--models-max",
        type=int,
        metavar="N",
        help="at most N models loaded at once: a load over it first unloads the least "
        "recently used idle, unpinned model, else waits (within the request's deadline) "
        "for one to go idle (default: no cap)",
    )
    run_time.add_argument(
        "--models-memory",
        type=_size,
        metavar="BYTES",
        help="at most this much memory for the loaded models together, as each load "
        "measured it (a GGUF's file size plus KV cache before its first load): bytes, or "
        "with a unit: 512M, 8G; over it, as with --models-max (default: no cap)",
    )
    run_time.add_argument(
        "--autoload",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a request for a catalog model that is not loaded loads it (default: on with "
        "--models-dir)",
    )
    edge = serve.add_argument_group("edge", "API keys, CORS, access log (off by default)")
    edge.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help="accept this API key (repeatable; also ZEROSERVE_API_KEY). Command lines are "
        "visible to other users: prefer --api-keys-file or the environment",
    )
    edge.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="TOML file of [keys.NAME] tables: key, and optional max_concurrent, "
        "requests_per_minute, tokens_per_minute, admin (true: may load and unload models)",
    )
    edge.add_argument(
        "--auth-metrics",
        action="store_true",
        default=None,
        help="require an API key for /metrics too",
    )
    edge.add_argument(
        "--cors-origins",
        action="append",
        metavar="ORIGINS",
        help="browser origins allowed to call the API, comma-separated or repeated, or '*'",
    )
    edge.add_argument(
        "--cors-allow-credentials",
        action="store_true",
        default=None,
        help="allow credentialed CORS requests (listed origins only)",
    )
    edge.add_argument(
        "--access-log", metavar="PATH", help="write one JSON line per request to PATH ('-': stderr)"
    )
    edge.add_argument(
        "--otel",
        action="store_true",
        default=None,
        dest="tracing",
        help="OpenTelemetry spans exported over OTLP (OTEL_EXPORTER_OTLP_* variables; needs "
        "the [otel] extra)",
    )
    tls = serve.add_argument_group("TLS")
    tls.add_argument(
        "--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate chain"
    )
    tls.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    tls.add_argument(
        "--ssl-ca-certs",
        metavar="PEM",
        help="require client certificates signed by these CAs (mTLS)",
    )
    images = serve.add_argument_group("images", "remote chat images (off by default)")
    images.add_argument(
        "--allow-image-urls",
        action="append",
        metavar="HOSTS",
        help="fetch chat images given by http(s) URL from these hosts only, comma-separated "
        "or repeated; every address and redirect is checked (loopback, private, "
        "link-local and metadata addresses refused). Default: image URLs are refused",
    )
    images.add_argument(
        "--allow-image-urls-loopback",
        action="store_true",
        default=None,
        help="UNSAFE, for tests: let image fetches reach loopback addresses (private, "
        "link-local and metadata addresses stay refused)",
    )
    serve.add_argument(
        "--drain-ready-delay",
        type=float,
        metavar="SECONDS",
        help="after SIGTERM, answer /ready 503 for this long before refusing connections",
    )
    serve.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=None,
        help="do not serve the playground and dashboard page at / (config key ui, env ZEROSERVE_UI)",
    )

    models = sub.add_parser(
        "models",
        help="list the models a configuration serves, with capabilities",
        description="List the models a configuration serves, with their capabilities and "
        "state (a --model is loaded at start; a --models-dir model on demand), or with --url "
        "the catalog of a running server with each model's state now.",
        epilog=MODELS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(models)
    models.add_argument("--models-dir", metavar="DIR", help="the models directory to list")
    models.add_argument(
        "--url", metavar="URL", help="list a running server's catalog (its GET /models)"
    )

    bench = sub.add_parser(
        "bench", help="load a running server: req/s, TTFT, inter-token latency, percentiles"
    )
    add_loadgen_arguments(bench)

    pull = sub.add_parser(
        "pull",
        help="fetch a model into the cache (hf:ORG/REPO[:FILE_OR_QUANT] or https://URL)",
        description="Fetch a model into the cache (ZEROSERVE_CACHE, else ~/.cache/zeroserve). "
        "SOURCE is hf:ORG/REPO[:FILE_OR_QUANT] or https://URL, optionally pinned with "
        "?sha256=HEX (checked before use; a mismatch deletes the file). An interrupted "
        "download resumes on the next pull. The model goes by NAME (default: the file's "
        "name without .gguf) in `zeroserve list` and `zeroserve rm`, and in the catalog "
        "of a server that serves the cache, across restarts.",
    )
    pull.add_argument("source", metavar="SOURCE")
    pull.add_argument("--name", metavar="NAME", help="the model's name (letters, digits, ._:-)")
    sub.add_parser("list", help="list the models in the cache: name, size in bytes, path")
    rm = sub.add_parser(
        "rm",
        help="remove a cached model's NAME (as `zeroserve list` shows it), and its file "
        "once no other name uses it",
    )
    rm.add_argument("name", metavar="NAME")
    return p


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``5m`` or ``1h`` (``--keep-alive``)."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: seconds, or a number with s, m or h"
        ) from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be 0 or more")
    return seconds


_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    """Bytes from ``1073741824``, ``512M``, ``8G`` (binary units; ``K``, ``M``, ``G``,
    ``T``, any case, an optional trailing ``B`` or ``iB``)."""
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (raw[:-1], raw[-1]) if raw[-1:] in _SIZE_UNITS else (raw, "")
    try:
        size = float(number) * _SIZE_UNITS.get(unit, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: bytes, or a number with K, M, G or T"
        ) from None
    if not 1 <= size < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least 1 byte")
    return int(size)


def _cache_command(args: argparse.Namespace) -> int:
    from .models.cache import (
        MODEL_NAME,
        cached_models,
        check_model_name,
        name_file,
        remove_model,
    )
    from .models.pull import pull

    if args.command == "pull":
        if args.name is not None:
            check_model_name(args.name)  # before anything is fetched
        path = pull(args.source)
        name = args.name or path.stem
        if MODEL_NAME.match(name):  # else it is listed under the file's own name
            before = name_file(name, path, args.source)
            if before is not None:
                print(
                    f"zeroserve pull: {name!r} now names this file, not {before}", file=sys.stderr
                )
        print(path)
        return 0
    if args.command == "list":
        for name, path in cached_models():
            print(f"{name}\t{path.stat().st_size}\t{path}")
        return 0
    if not remove_model(args.name):
        print(f"zeroserve rm: no cached model named {args.name!r}", file=sys.stderr)
        return 1
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="SPEC",
        help=f"model to serve, repeatable: NAME=module:Class, a built-in ({', '.join(BUILTINS)}), "
        f"or NAME=BACKEND:LOCATION ({', '.join(BACKENDS)}), e.g. NAME=llamacpp:/path/model.gguf; "
        "options after '?', e.g. 'mine=my_model:MyModel?executor=process&workers=2'",
    )
    p.add_argument(
        "--allow-pull",
        action="store_true",
        help="let a --model NAME=hf:ORG/REPO[:FILE] (or NAME=https://URL) spec fetch its "
        "file into the cache (ZEROSERVE_CACHE) at start, a --models-dir model.toml's "
        "source at the model's first load, and an admin POST /models/pull; without it "
        "such a spec is an error, such an entry is failed, the route answers 403, and "
        "nothing is fetched",
    )
    p.add_argument(
        "--serve-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="put the models in the pull cache (as `zeroserve list` names them) in the "
        "catalog, unloaded; an explicit --model or --models-dir model of the same name wins "
        "(default: on with --models-dir or --allow-pull and one worker; config key "
        "serve_cache)",
    )
    p.add_argument("--config", help="TOML configuration file")


def model_specs(cfg: Config, allow_pull: bool = False) -> list[ModelRef]:
    """The ``--model`` specs parsed; one naming ``hf:``/a URL is pulled first when
    ``allow_pull`` (``models/pull.py``, ``spec_from_pull``), else ``ConfigError``."""
    texts = list(cfg.models)
    if not texts and cfg.default_models and cfg.models_dir is None:
        texts = list(DEFAULT_MODELS)
    specs = [parse_spec(spec_from_pull(t, allow_pull)) for t in texts]
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"model names must be unique: {', '.join(sorted(dupes))}")
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return loadgen_main(args)
    if args.command in ("pull", "list", "rm"):
        try:
            return _cache_command(args)
        except ZeroserveError as exc:
            print(f"zeroserve {args.command}: {exc}", file=sys.stderr)
            return 1
    overrides: dict[str, Any] = {"models": args.models, "serve_cache": args.serve_cache}
    if args.command == "models":
        if args.url is not None:
            return _list_served(args.url)
        overrides["models_dir"] = args.models_dir
    if args.command == "serve":
        overrides.update(
            host=args.host,
            port=args.port,
            workers=args.workers,
            loop=args.loop,
            loop_rt_priority=args.loop_rt_priority,
            arena_bytes=args.arena_bytes,
            log_level=args.log_level,
            ui=args.ui,
            models_dir=args.models_dir,
            keep_alive_s=args.keep_alive,
            models_max=args.models_max,
            models_memory=args.models_memory,
            autoload=args.autoload,
            data_dir=args.data_dir,
        )
        if args.max_body_bytes is not None:
            overrides["limits"] = {"max_body_bytes": args.max_body_bytes}
        runtime_overrides: dict[str, Any] = {}
        if args.queue_depth is not None:
            runtime_overrides["queue_depth"] = args.queue_depth
        if args.request_timeout is not None:
            runtime_overrides["default_deadline_s"] = args.request_timeout
        if args.ray_address is not None:
            runtime_overrides["ray_address"] = args.ray_address
        if args.model_nice is not None:
            runtime_overrides["model_nice"] = args.model_nice
        if runtime_overrides:
            overrides["runtime"] = runtime_overrides
        if args.drain_ready_delay is not None:
            overrides["timeouts"] = {"drain_ready_delay": args.drain_ready_delay}
        cors = [o for v in args.cors_origins or () for o in v.split(",") if o]
        overrides["edge"] = _given(
            api_keys=args.api_keys,
            api_keys_file=args.api_keys_file,
            auth_metrics=args.auth_metrics,
            cors_origins=cors or None,
            cors_allow_credentials=args.cors_allow_credentials,
            access_log=args.access_log,
            tracing=args.tracing,
        )
        hosts = [h for v in args.allow_image_urls or () for h in v.split(",") if h]
        overrides["images"] = _given(
            allow_urls=hosts or None, allow_loopback_urls=args.allow_image_urls_loopback
        )
        overrides["tls"] = _given(
            certfile=args.ssl_certfile, keyfile=args.ssl_keyfile, ca_certs=args.ssl_ca_certs
        )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            cfg = load_config(args.config, overrides=overrides)
        for w in caught:
            print(f"zeroserve: warning: {w.message}", file=sys.stderr)
        logging.basicConfig(
            level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        _import_from_cwd()
        specs = model_specs(cfg, args.allow_pull)
        models_dir = Path(cfg.models_dir) if cfg.models_dir is not None else None
        cache = cache_dir() if cfg.serves_cache(args.allow_pull) else None
        if args.command == "models":
            return _list_models(server_catalog(specs, models_dir, cache))
        from .server.run import CatalogOptions, serve

        return serve(
            cfg.server_options(),
            specs,
            arena_bytes=cfg.arena_bytes,
            loop=cfg.loop,
            loop_rt_priority=cfg.loop_rt_priority,
            workers=cfg.workers,
            runtime=cfg.runtime_options(),
            edge=cfg.edge.options(),
            ui=cfg.ui,
            api_limits=cfg.app_limits(),
            catalog=CatalogOptions(
                models_dir=models_dir,
                cache=cache,
                keep_alive_s=cfg.keep_alive_s,
                models_max=cfg.models_max,
                models_memory=cfg.models_memory,
                autoload=cfg.autoloads,
                allow_pull=args.allow_pull,
            ),
            batch=cfg.batch_options(),
            image_fetch=cfg.image_fetch(),
        )
    except ZeroserveError as exc:
        print(f"zeroserve: error: {exc.message}", file=sys.stderr)
        return 2


def _import_from_cwd() -> None:
    """Let ``--model NAME=my_model:MyModel`` find ``my_model.py`` in the current directory,
    as ``python -m zeroserve`` does: the console script's ``sys.path`` starts at its own
    directory instead. Appended, so it never shadows an installed module; spawned workers
    get the same ``sys.path``."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _list_models(catalog: dict[str, CatalogEntry]) -> int:
    for entry in catalog.values():
        spec = entry.ref
        cls = spec.load_class()
        caps = ", ".join(sorted(cls.capabilities())) or "-"
        executor = spec.runtime.get("executor", cls.executor)
        when = "at start" if entry.origin == "--model" else "on demand"
        print(f"{spec.name:<16} {caps:<24} executor={executor:<8} {when:<9} {cls.description}")
    return 0


def _list_served(url: str) -> int:
    """A running server's catalog with states (``GET /models``, llama.cpp router's)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=30) as answer:
            listing = json.load(answer)
    except (OSError, ValueError) as exc:
        print(f"zeroserve models: cannot read {url}/models: {exc}", file=sys.stderr)
        return 1
    for model in listing["data"]:
        status = model["status"]
        state = "failed" if status.get("failed") else status["value"]
        pinned = "pinned" if model.get("pinned") else ""
        reason = status.get("reason", "")
        print(f"{model['id']:<16} {state:<10} {pinned:<6} {reason}".rstrip())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["main"]
