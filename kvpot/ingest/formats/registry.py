"""The document formats kvpot reads as text, in the order they are asked to claim a file (the first
that claims it reads it). A format is its own module holding one `Format` (kvpot.ingest.formats.base);
adding one is adding it here. Plain text, and binary files, are what no format claims; compressed
files are the containers a streaming format (HTML) or plain text is read from.
"""

from __future__ import annotations

from kvpot.ingest.formats import epub, html, office, pdf
from kvpot.ingest.formats.base import Format

FORMATS: tuple[Format, ...] = (pdf.FORMAT, epub.FORMAT, office.DOCX, office.ODT, html.FORMAT)
