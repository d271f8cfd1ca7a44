"""Grammar-constrained decoding (structured outputs) on llguidance.

    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, schema_text)     # from the request (wire.py)
    compiled = compiler.compile(spec)        # once per distinct spec (cached), or start()
    matcher = compiled.matcher()             # one per choice (cheap copy of the template)
    masks = fill_bitmasks(matchers)          # before sampling: int32 [G, ceil(V / 32)]
    matcher.accept(token)                    # after sampling: advance with the committed token

Module map: docs/engine.md ("Structured outputs").
"""

from services.engine.grammar.compiler import CompiledGrammar, GrammarCompiler
from services.engine.grammar.matcher import GrammarMatcher, fill_bitmasks
from services.engine.grammar.spec import GrammarKind, GrammarSpec
from services.engine.grammar.vocabulary import GrammarVocabulary, bitmask_words

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarKind", "GrammarMatcher",
           "GrammarSpec", "GrammarVocabulary", "bitmask_words", "fill_bitmasks"]
