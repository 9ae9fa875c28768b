"""The command and group classes every kvpot command uses: old option spellings kept as hidden aliases for one
release, and help that reads as a user types (no Python type names, usage lines as the metavars say).

Aliases are rewritten in the argument list before click parses it, so an old spelling and its new
name are the same option with the same value and the same checks; the help never lists the old one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, get_args, get_origin

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:  # typer 0.26 on carries its own click (typer._click), earlier ones use click's
    from click import Context

from ._common import err

# what each type reads as in --help, in place of typer's Python annotations (<int>, <list[str]>)
TYPE_LABELS = {int: "N", float: "X", str: "TEXT", Path: "PATH"}
# the same by click's parameter type names, for typers before 0.29 (no type_descriptor)
CLICK_TYPE_LABELS = {"integer": "N", "integer range": "N", "float": "X", "float range": "X", "text": "TEXT",
                     "path": "PATH", "filename": "PATH"}


class _Readable:
    """Help with readable labels: every parameter's (_readable), and the help flag's (no "<bool>")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            _readable(param)

    def format_help(self, ctx: Context, formatter) -> None:
        """The help with no range beside a label: typers before 0.29 print a range type's bounds there
        ("N [x>=16]"), widening the label column until each help is a narrow strip. The bounds are said
        when a value breaks them; the types are put back at once, so parsing checks them as ever."""
        ranged = [(p, p.type) for p in self.params if _is_range(getattr(p, "type", None))]
        for p, kind in ranged:
            p.type = next(c for c in type(kind).__mro__ if c.__name__ in ("IntParamType", "FloatParamType"))()
        try:
            super().format_help(ctx, formatter)
        finally:
            for p, kind in ranged:
                p.type = kind

    def get_help_option(self, ctx: Context):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # a flag takes no value
        return option


class KvpotCommand(_Readable, TyperCommand):
    """A Typer command with deprecated spellings (`aliases`, old -> new) and readable type labels."""

    aliases: ClassVar[dict[str, str]] = {}

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """`[OPTIONS] [FILE]... QUESTION`: an argument's metavar as written, not wrapped in {}..."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument) and param.metavar:
                pieces.append(param.metavar)
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._rewrite(args))

    def _rewrite(self, args: list[str]) -> list[str]:
        if not self.aliases:
            return args
        takes_value = {opt for p in self.params if isinstance(p, TyperOption) and not p.is_flag for opt in p.opts}
        out: list[str] = []
        value_next = False
        for i, arg in enumerate(args):
            if arg == "--":  # everything after is an argument, however it looks
                return out + args[i:]
            if value_next:  # the value of the option before it, e.g. a question that reads "--ctx"
                out.append(arg)
                value_next = False
                continue
            name, eq, value = arg.partition("=")
            new = self.aliases.get(name)
            if new is None and len(arg) > 2 and arg[:2] in self.aliases and not arg.startswith("--"):
                name, new, eq, value = arg[:2], self.aliases[arg[:2]], "", arg[2:]  # -n600: a short option and its value
            if new is not None:
                err.print(f"[yellow]{name} is deprecated and will be removed in the next release; use {new}[/yellow]",
                          soft_wrap=True)
                arg = new + ("=" + value if eq or value else "")
            out.append(arg)
            value_next = arg in takes_value  # "--ctx-size 64", not "--ctx-size=64" or "-c64"
        return out


class KvpotGroup(_Readable, TyperGroup):
    """A command group (kvpot, kvpot bench, ...) with the same readable labels as its commands."""


def _is_range(kind) -> bool:
    """click's IntRange or FloatRange, from whichever click the typer in use parses with."""
    return any(c.__name__ == "_NumberRangeBase" for c in type(kind).__mro__)


def _readable(param) -> None:
    if isinstance(param, TyperArgument):
        # the metavar says it all ("[FILE]... QUESTION"); typer would add <list[str]> (0.29 on: from
        # display_type_rich) or <str> (0.26-0.28: the type's name, where its get_metavar gives None)
        param.display_type_rich = lambda ctx: None
        if getattr(param, "type", None) is not None:  # 0.29 sets it later, and asks display_type_rich
            param.type = copy.copy(param.type)  # click's types are shared instances: change this one only
            param.type.get_metavar = lambda *args, **kwargs: ""
        return
    if isinstance(param, TyperOption) and param.is_flag and not param.is_eager and param.show_default is True:
        # a flag's default as the user would type it: "--stock", "on"; a plain flag that is off unless
        # given says nothing (a line of "[default: off]" per flag would crowd the help)
        if param.secondary_opts:
            param.show_default = param.opts[-1] if param.default else param.secondary_opts[-1]
        else:
            param.show_default = "on" if param.default else False
    if isinstance(param, TyperOption) and param.required:
        param.show_default = False  # "[required]" says it; typers before 0.29 would add "[default: None]"
    if isinstance(param.show_default, str):
        # said as written: typer would wrap it in parentheses ("[default: (auto)]")
        text = param.show_default
        param._get_default_string = lambda **kw: text
    if isinstance(param, TyperOption) and hasattr(param, "_get_number_range_help_str"):
        # a bound is said when a value breaks it; beside the label it would widen the column ("N [x>=16]")
        # and leave the help a narrow strip (typer 0.29 on: typers before it show the type's range)
        param._get_number_range_help_str = lambda: None
    if isinstance(param, TyperOption) and param.metavar is None:
        if param.is_flag:
            param.metavar = ""  # a flag takes no value
            return
        param.metavar = _type_label(param)


def _type_label(param: TyperOption) -> str:
    """N, X, TEXT, PATH or VALUE for an option's value. From typer's type descriptor where it has one
    (0.29 on); before that, from click's parameter type, which is what those typers parse with."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return CLICK_TYPE_LABELS.get(getattr(param.type, "name", ""), "VALUE")
    kind = desc.annotation
    if get_origin(kind) is list:  # a repeatable option: each use takes one value
        kind = get_args(kind)[0]
    return "PATH" if desc.is_path else TYPE_LABELS.get(kind, "VALUE")


def aliased(aliases: dict[str, str]) -> type[KvpotCommand]:
    """The command class for a command whose options had other spellings (old -> new)."""
    return type("AliasedCommand", (KvpotCommand,), {"aliases": dict(aliases)})


def policy_names() -> str:
    """Every policy kvpot runs, from the registry, for help texts."""
    from kvpot.api.plan import known_policies

    return ", ".join(known_policies())


# the help panel of the options a user rarely needs: every command lists its everyday options first, these after
ADVANCED = "Advanced"

# -m in ask, chat and run: a saved context's model comes first where --context is given (kvpot.session.default_model)
MODEL_HELP = "a `kvpot models` name or a .gguf path, else $KVPOT_MODEL"
MODEL_DEFAULT = "the most capable downloaded"

# one answer length for ask, chat and run: a paragraph, which is what a question about a document wants,
# and small enough that the cells kept free for it (the answer reserve) cost little beside the document
N_PREDICT_HELP = "most tokens in an answer (llama.cpp's -n)"


# how much ask, chat and run say on stderr (cli._common.set_verbosity)
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="more on stderr: files left out, the plan")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="nothing on stderr but errors")]
