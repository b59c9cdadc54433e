"""What an evaluation task is, as data: a :class:`Task` record and the :class:`Option` records of its own options.

lm-eval declares a task as one YAML file; here a task is one :class:`Task` in :data:`evals.tasks.TASKS`: its name,
its ``python -m evals`` command and help, the options it takes beside the model options every task takes (each an
:class:`Option`: name, default, help, how a command-line value is parsed and how any value is checked), the function
that scores a model and returns the rows, and an optional check of the settings against the model. The command line,
:class:`evals.tasks.EvalSpec` and the rows' ``settings`` are all built from these records, so a new task is one record
and its scoring function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Option:
    """One option of a task's own: ``name`` is its key in :attr:`EvalSpec.options` and in a row's ``settings`` and,
    with dashes, its flag (``max_tokens`` -> ``--max-tokens``). ``parse`` (argparse's ``type``), ``choices`` and
    ``many`` (one or more values) shape the command line; ``minimum`` (with ``why``) is the rule a value given in
    code must also meet (None always passes: the option's "all" or "the default")."""

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    many: bool = False
    minimum: int | None = None
    why: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def argparse_keywords(self) -> dict[str, Any]:
        """The keywords of ``parser.add_argument(self.flag, ...)``."""
        keywords: dict[str, Any] = {}
        if self.many:
            keywords["nargs"] = "+"
        if self.parse is not None:
            keywords["type"] = self.parse
        keywords["default"] = list(self.default) if self.many else self.default
        if self.choices is not None:
            keywords["choices"] = list(self.choices)
        keywords["help"] = self.help
        return keywords

    def checked(self, value: Any) -> Any:
        """``value`` as a spec holds it (a tuple for an option of several values); ValueError naming the value and
        the rule when it is below :attr:`minimum`."""
        if self.many:
            return (value,) if isinstance(value, str) else tuple(value)
        if value is not None and self.minimum is not None and value < self.minimum:
            raise ValueError(f"{self.name}={value} must be >= {self.minimum}" + (f" ({self.why})" if self.why else ""))
        return value


@dataclass(frozen=True)
class Task:
    """One zero-shot evaluation of a GPT checkpoint: its name (:attr:`EvalSpec.task`), its ``python -m evals``
    command and help, the function that scores the model (``evaluate(spec, model, tokenizer, common) -> rows``,
    ``common`` the model and checkpoint fields every row carries), the options of its own and, where its settings
    must fit the model, ``check(spec, config)`` (a ValueError naming the value), met before any scoring."""

    name: str
    command: str
    help: str
    evaluate: Callable[[Any, Any, Any, dict[str, Any]], list[dict[str, Any]]]
    options: tuple[Option, ...] = ()
    check: Callable[[Any, Any], None] | None = None
