"""The cells a session keeps past its budget for the conversation: the first question, the answer and
the next turn. The checks made before a model loads and the Session that sizes its context both use it,
so what is checked is what runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpot.engine import MIN_TURN_ROOM

if TYPE_CHECKING:  # the checks import this module, and the settings import the checks
    from kvpot.session.settings import RunSettings

# room for the first question's tokens in the answer reserve (longer questions go through the pot)
QUESTION_ROOM = 128


def answer_reserve(settings: RunSettings) -> int:
    """Cells a session keeps past the budget for the first question, the answer and the next turn."""
    return settings.max_tokens + MIN_TURN_ROOM + QUESTION_ROOM
