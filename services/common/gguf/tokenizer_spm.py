"""SentencePiece (`tokenizer.ggml.model = llama`) -> a `tokenizers` BPE Tokenizer with byte
fallback.

A GGUF keeps SentencePiece's pieces and scores but no merge list. SentencePiece BPE joins, at
each step, the adjacent pair whose joined piece ranks best; so a merge list ordered by the
joined piece's rank reproduces it: every split (left, right) of a piece with both halves in the
vocabulary becomes a merge. The rank is the score; for Gemma it is the piece's position in the
file, which is the order Gemma's own tokenizer.json lists its merges in (its scores are not).

Spaces are "▁" inside the model: text has its spaces replaced (and, with add_space_prefix, one
"▁" prepended to the start), decoding turns them back and joins <0xNN> byte pieces into UTF-8.
llama.cpp writes Gemma's whitespace-run pieces with real spaces; they are respelled with "▁"
here so that they are reachable.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from services.common.gguf.vocab import GGUFVocab, TokenType

SPACE = "\u2581"   # ▁
# Architectures whose merge order is the vocabulary order rather than the scores.
POSITION_RANKED = frozenset({"gemma", "gemma2", "gemma3"})


def spell_sentencepiece(token: str) -> str:
    """A run of spaces as SentencePiece spells it ("  " -> "▁▁"); other pieces unchanged."""
    if token and set(token) == {" "}:
        return SPACE * len(token)
    return token


def _spelled_tokens(vocab: GGUFVocab) -> list[str]:
    present = set(vocab.tokens)
    spelled = []
    for token in vocab.tokens:
        respelled = spell_sentencepiece(token)
        spelled.append(token if respelled in present and respelled != token else respelled)
    return spelled


def sentencepiece_merges(spelled: list[str], priority: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a piece into two pieces, best-ranked joined piece first;
    between equal ranks the longer left half first, then the file's order."""
    ids: dict[str, int] = {}
    for token_id, token in enumerate(spelled):
        ids.setdefault(token, token_id)
    candidates = []
    for token_id, token in enumerate(spelled):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                candidates.append((-priority[token_id], -len(left), -len(right), token_id,
                                   left, right))
    candidates.sort(key=lambda c: c[:4])
    return [(c[4], c[5]) for c in candidates]


def sentencepiece_tokenizer(vocab: GGUFVocab, architecture: str) -> tuple[Tokenizer, list[str]]:
    """The SentencePiece tokenizer and each id's spelling in its vocabulary."""
    spelled = _spelled_tokens(vocab)
    if architecture in POSITION_RANKED:
        priority = [-float(i) for i in range(len(spelled))]
    else:
        priority = list(vocab.scores or ())
    table = {token: token_id for token_id, token in enumerate(spelled)}
    unk = vocab.token(vocab.unk_id)
    if unk is None and TokenType.UNKNOWN in vocab.token_types:
        unk = vocab.tokens[vocab.token_types.index(TokenType.UNKNOWN)]
    model = models.BPE(vocab=table, merges=sentencepiece_merges(spelled, priority),
                       dropout=None, unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    steps: list[decoders.Decoder] = [decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse()]
    if vocab.add_space_prefix:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer, spelled
