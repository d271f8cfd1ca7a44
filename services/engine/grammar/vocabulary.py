"""GrammarVocabulary: the model's vocabulary as the grammar library sees it, loaded once.

llguidance needs every token's bytes (and which tokens are special and end a sequence): it reads
them from the core's `tokenizer.json`, with the vocabulary widened to the model's embedding size
(tokens beyond the tokenizer's are never allowed) and the manifest's EOS ids. Loading takes
about a second for a 150k-token vocabulary and holds the GIL, so the engine does it once: at
startup (`--structured-outputs eager`, the CUDA default) or at the first grammar request
(`lazy`, the CPU default). The GIL is held for the whole build, never released between steps,
so a thread building it beside the weight load only stalls the load (measured on the CPU box:
no tensor of a 310-tensor checkpoint was read while it ran); it is built after the load.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from services.common.errors import UnsupportedError

log = logging.getLogger(__name__)


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row's allowed-token bitmask (bit t % 32 of word t // 32)."""
    return (vocab_size + 31) // 32


class GrammarVocabulary:
    def __init__(self, tokenizer_path: Path | None, vocab_size: int,
                 eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._tokenizer: Any = None
        self._failure: UnsupportedError | None = None
        self._lock = threading.Lock()

    @property
    def words(self) -> int:
        return bitmask_words(self.vocab_size)

    @property
    def is_loaded(self) -> bool:
        return self._tokenizer is not None

    def tokenizer(self) -> Any:
        """The llguidance tokenizer (loaded on first use; thread-safe). A tokenizer llguidance
        cannot read is an UnsupportedError, remembered so later requests fail fast too."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._tokenizer is None:
                try:
                    self._tokenizer = self._load()
                except UnsupportedError as exc:
                    self._failure = exc
                    raise
            return self._tokenizer

    def _load(self) -> Any:
        path = self.tokenizer_path
        if path is None or not path.is_file():
            raise UnsupportedError("structured outputs need the model's tokenizer.json, which "
                                   "this model directory lacks", param="grammar")
        import llguidance

        started = time.perf_counter()
        try:
            tokenizer = llguidance.LLTokenizer(path.read_text(encoding="utf-8"),
                                               n_vocab=self.vocab_size,
                                               eos_token=list(self.eos_token_ids) or None)
        except Exception as exc:  # the library's own errors (ValueError ...) for odd tokenizers
            raise UnsupportedError(
                f"structured outputs are unavailable for this model: its tokenizer.json cannot "
                f"be read by the grammar engine ({exc})", param="grammar") from exc
        log.info("grammar vocabulary loaded: %d tokens in %.2f s", self.vocab_size,
                 time.perf_counter() - started)
        return tokenizer
