"""GrammarCompiler: a GrammarSpec -> a grammar compiled against the model's vocabulary, cached.

Compiling means: the spec becomes an llguidance grammar (JSON Schema and JSON mode with the
engine's JSON defaults, a regex, or Lark, GBNF converted), the library validates it against the
vocabulary (its message becomes a `GrammarError`, the request's admission error), and a
template matcher is built (lexer and parser tables: up to hundreds of milliseconds for large
schemas, without the GIL). Each choice then copies the template (`CompiledGrammar.matcher`,
microseconds). Results, failures included, are kept in an LRU keyed by the spec.

The engine core never compiles on its loop thread: `start` runs the work on one background
thread and returns a future; the core admits the request when it resolves (docs/engine.md).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from services.common.errors import GrammarError, HeliosError
from services.engine.grammar.matcher import GrammarMatcher
from services.engine.grammar.spec import GrammarKind, GrammarSpec
from services.engine.grammar.vocabulary import GrammarVocabulary

log = logging.getLogger(__name__)

# JSON output: any amount of whitespace is valid JSON, and a weak model can write it forever;
# each gap between JSON tokens may hold at most 16 whitespace characters (enough to indent
# pretty-printed JSON several levels deep).
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{1,16}"
ANY_JSON_OBJECT = '{"type": "object"}'
MAX_MESSAGE = 2000


def json_defaults(lenient: bool, schema: Any = None) -> dict[str, Any]:
    """The engine's JSON compile options; a schema's own top-level `x-guidance` wins (one
    that sets its whitespace keeps the library's meaning of it)."""
    options: dict[str, Any] = {"lenient": lenient}
    own = schema.get("x-guidance") if isinstance(schema, dict) else None
    if not (isinstance(own, dict) and ({"whitespace_flexible", "whitespace_pattern"} & set(own))):
        options["whitespace_pattern"] = JSON_WHITESPACE
    return options


class CompiledGrammar:
    """A validated grammar and its template matcher (never advanced: copied per choice)."""

    def __init__(self, spec: GrammarSpec, template: Any, seconds: float) -> None:
        self.spec = spec
        self._template = template
        self.compile_seconds = seconds

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy())


def _grammar_text(spec: GrammarSpec) -> str:
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        if spec.kind is GrammarKind.JSON_OBJECT:
            return llguidance.LLMatcher.grammar_from_json_schema(
                ANY_JSON_OBJECT, defaults=json_defaults(spec.lenient))  # type: ignore[arg-type]
        if spec.kind is GrammarKind.JSON_SCHEMA:
            try:
                schema = json.loads(spec.text)
            except ValueError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}",
                                   param="grammar") from exc
            if not isinstance(schema, dict | bool):
                raise GrammarError("a JSON schema must be an object or a boolean",
                                   param="grammar")
            return llguidance.LLMatcher.grammar_from_json_schema(
                spec.text, defaults=json_defaults(spec.lenient, schema))  # type: ignore[arg-type]
        if spec.kind is GrammarKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(spec.text)
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.text))
    except GrammarError:
        raise
    except Exception as exc:   # the library's parse errors (ValueError and friends)
        raise GrammarError(_clip(f"invalid {spec.kind.value} grammar: {exc}"),
                           param="grammar") from exc


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " ..."


class GrammarCompiler:
    def __init__(self, vocabulary: GrammarVocabulary, *, cache_size: int = 64) -> None:
        self.vocabulary = vocabulary
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar | HeliosError] = OrderedDict()
        self._running: dict[GrammarSpec, concurrent.futures.Future[CompiledGrammar]] = {}
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor: Any = None
        self.num_compiled = 0
        self.num_failed = 0

    @property
    def words(self) -> int:
        return self.vocabulary.words

    @property
    def executor(self) -> Any:
        """llguidance's parallel mask executor (threads outside the GIL)."""
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor

    def lookup(self, spec: GrammarSpec) -> CompiledGrammar | None:
        """A cached compilation (None: not compiled yet); a cached failure is raised again."""
        with self._lock:
            found = self._cache.get(spec)
            if found is None:
                return None
            self._cache.move_to_end(spec)
        if isinstance(found, HeliosError):
            raise found
        return found

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile now on the calling thread (cached)."""
        found = self.lookup(spec)
        return found if found is not None else self._compile(spec)

    def start(self, spec: GrammarSpec) -> concurrent.futures.Future[CompiledGrammar]:
        """Compile on the background thread; one job per spec however many requests wait (a
        spec already compiled, or refused, comes back as a finished future of that result:
        a job that finished between two starts is not run again)."""
        with self._lock:
            running = self._running.get(spec)
            if running is not None:
                return running
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                done: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
                if isinstance(cached, HeliosError):
                    done.set_exception(cached)
                else:
                    done.set_result(cached)
                return done
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="grammar-compile")
            future = self._pool.submit(self._compile, spec)
            self._running[spec] = future
        future.add_done_callback(lambda _: self._forget(spec))
        return future

    def close(self) -> None:
        """Stop the background thread (queued compilations are dropped; a later `start`
        begins a new one)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _forget(self, spec: GrammarSpec) -> None:
        with self._lock:
            self._running.pop(spec, None)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        started = time.perf_counter()
        try:
            import llguidance

            tokenizer = self.vocabulary.tokenizer()
            grammar = _grammar_text(spec)
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, tokenizer)
            if failed:
                raise GrammarError(_clip(messages[0] if messages else "invalid grammar"),
                                   param="grammar")
            template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            if template.is_error():
                raise GrammarError(_clip(template.get_error()), param="grammar")
        except HeliosError as exc:
            self._store(spec, exc)
            self.num_failed += 1
            log.info("grammar %s refused: %s", spec.describe(), exc.message[:200])
            raise
        compiled = CompiledGrammar(spec, template, time.perf_counter() - started)
        self._store(spec, compiled)
        self.num_compiled += 1
        log.debug("grammar %s compiled in %.1f ms", spec.describe(),
                  compiled.compile_seconds * 1e3)
        return compiled

    def _store(self, spec: GrammarSpec, value: CompiledGrammar | HeliosError) -> None:
        with self._lock:
            self._cache[spec] = value
            self._cache.move_to_end(spec)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
