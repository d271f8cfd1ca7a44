"""Structured outputs: response formats and forced tool calls as the engine's grammar.

Module map: docs/frontend.md ("Structured outputs").
"""

from services.frontend.structured.builder import build_grammar
from services.frontend.structured.grammar import EngineGrammar, GrammarKind

__all__ = ["EngineGrammar", "GrammarKind", "build_grammar"]
