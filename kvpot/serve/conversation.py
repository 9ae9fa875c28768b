"""An OpenAI request's messages as the segments kvpot decodes after a document (or with none).

A document is read once, as `kvpot chat` reads it: the model's template opens the first user turn and the
document follows. A request's conversation goes after it the way chat's turns do: its first user message is
the first question, each earlier answer and the user message after it a follow-up, so a request with one user
message is exactly `Session.ask` of that message. System messages cannot go before a document that is already
read: their text goes after the document, before the first question. Without a document (the plain model) the
whole conversation is rendered with the model's template, system messages where the template puts them.

Message text is never parsed for control tokens (a message holding "<|im_end|>" stays text); only the
template's own markup is (kvpot.session.prompting).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpot.session.prompting import Segment


class BadRequest(ValueError):
    """The request cannot be answered as sent (HTTP 400); the message names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


SYSTEM_ROLES = ("system", "developer")  # "developer" is OpenAI's newer name for system instructions


@dataclass(frozen=True)
class Conversation:
    system: str                   # the system messages' text, joined ("" if none)
    turns: list[tuple[str, str]]  # (role, text), role "user" or "assistant", alternating, first and last "user"


def _text(content, i: int) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text parts are taken."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"messages[{i}].content: only text parts are supported, got {kind!r}",
                                 f"messages[{i}].content")
            out.append(part["text"])
        return "".join(out)
    if content is None:
        return ""
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse_messages(messages) -> Conversation:
    """OpenAI's `messages` checked and folded: system messages joined; consecutive messages of one role
    joined with a blank line; the conversation must end with a user message."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        role = msg.get("role")
        text = _text(msg.get("content"), i)
        if "\0" in text:
            raise BadRequest(f"messages[{i}].content holds a NUL character", f"messages[{i}].content")
        if role in SYSTEM_ROLES:
            if turns:  # a system message mid-conversation: kept as an instruction in the next user turn
                turns.append(("user", text))
            else:
                system.append(text)
            continue
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role {role!r} is not supported (system, user, assistant)",
                             f"messages[{i}].role")
        if turns and turns[-1][0] == role:
            turns[-1] = (role, turns[-1][1] + "\n\n" + text)
        else:
            turns.append((role, text))
    if not turns or turns[-1][0] != "user":
        raise BadRequest("the last message must be the user's", "messages")
    if not turns[-1][1].strip():
        raise BadRequest("the last user message is empty", "messages")
    if turns[0][0] == "assistant":  # an assistant greeting first: kept as context before the first question
        system.append(turns.pop(0)[1])
    return Conversation("\n\n".join(s for s in system if s.strip()), turns)


def after_document(fmt, conv: Conversation) -> list[Segment]:
    """The conversation as it follows a read document: chat's first question, then each answer and the
    follow-up after it (`fmt`: the session's CompletionFormat or ChatFormat)."""
    segs: list[Segment] = []
    if conv.system:
        segs.append(Segment("\n\n" + conv.system.strip()))
    first = True
    for role, text in conv.turns:
        if role == "assistant":
            segs.append(Segment(" " + text.strip() if fmt.name == "completion" else text.strip()))
        elif first:
            segs += fmt.first_question(text)
            first = False
        else:
            segs += fmt.follow_up(text)
    return segs


# a sentinel per message, cut out of the rendered template; \x01 cannot occur in a template's markup
def _sentinel(i: int) -> str:
    return f"\x01kvpot-message-{i}\x01"


def without_document(fmt, conv: Conversation, render=None) -> list[Segment]:
    """The conversation alone (the plain model): rendered by the model's template with each message's
    text as plain text (ChatFormat; `render(messages, add_assistant)` is the model's template), or as
    "Question: ... Answer:" lines (CompletionFormat)."""
    if fmt.name != "completion" and render is not None:
        msgs = ([("system", conv.system)] if conv.system else []) + list(conv.turns)
        rendered = render([(role, _sentinel(i)) for i, (role, _) in enumerate(msgs)], True)
        segs: list[Segment] = []
        for i, (_, text) in enumerate(msgs):
            before, sep, rendered = rendered.partition(_sentinel(i))
            if not sep:
                raise BadRequest("the model's chat template drops a message of this conversation", "messages")
            if before:
                segs.append(Segment(before, True))
            segs.append(Segment(text))
        if rendered:
            segs.append(Segment(rendered, True))
        return segs
    segs = [Segment(conv.system.strip() + "\n\n")] if conv.system else []
    for role, text in conv.turns:
        if role == "assistant":
            segs.append(Segment(" " + text.strip()))
        else:
            segs.append(Segment(("\n\n" if segs else "") + f"Question: {text.strip()}\nAnswer:"))
    return segs
