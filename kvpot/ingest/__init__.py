"""Text input for long documents: files, directories and stdin read lazily, tokenized in pieces."""

from kvpot.ingest.sources import Source, SourceSet, collect_sources, looks_like_input
from kvpot.ingest.tokenstream import IncrementalTokenizer

__all__ = ["Source", "SourceSet", "collect_sources", "looks_like_input", "IncrementalTokenizer"]
