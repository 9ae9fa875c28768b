"""kvpot's Python API: `Model` reads inputs into a `Document`, which answers (`Answer`), is saved and reopened;
`Plan` is one reading's every setting, decided and checked before the model loads (kvpot.api.plan)."""

from kvpot.api.answering import Answer
from kvpot.api.document import Document, Model
from kvpot.api.plan import Plan
from kvpot.errors import KvpotError
from kvpot.session.session import (
    ReadingStopped,  # raised by a read's progress callback, it stops the read there
    ReadProgress,  # what a read's progress callback hears after every chunk
)
from kvpot.state.read_point import ReadPoint  # where a stopped read goes on from (a saved context's read point)

__all__ = ["Answer", "Document", "KvpotError", "Model", "Plan", "ReadPoint", "ReadProgress", "ReadingStopped"]
