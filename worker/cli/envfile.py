"""deploy/env.example, generated from the settings classes: every ``ZQ_`` variable with its
default and its description (the field's docstring), commented out.

    python -m worker.cli.envfile > deploy/env.example

tests/unit/test_envfile.py fails when the file is out of step with the classes.
"""

from __future__ import annotations

import json
import sys
import textwrap
from enum import Enum

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from producer.settings import ProducerSettings
from worker.settings import WorkerSettings

WIDTH = 100  #: longest line, as in the code

HEADER = """\
# zettelq settings: every ZQ_ environment variable, with its default and what it does.
# Generated from producer/settings.py and worker/settings.py by
#   python -m worker.cli.envfile > deploy/env.example
# (do not edit by hand: a test fails when this file and the settings classes differ).
#
# Every line is commented out, so this file as it stands changes nothing: copy it, then
# uncomment and edit what you change. A variable with nothing after "=" is unset by default.
# Env files have no inline comments, so each comment sits on its own line.
# deploy/compose.yaml sets ZQ_REDIS_URL and ZQ_BROKER_URL itself (from deploy/.env or the
# shell): set them there for the compose stack.
"""

SECTIONS = (
    (
        "Producers (agents) and workers: producer/settings.py",
        ProducerSettings,
        "ZQ_KEY_PREFIX and ZQ_SHARD_COUNT must be the same on producers and workers.",
    ),
    ("Workers, searchers and beat only: worker/settings.py", WorkerSettings, None),
)


def env_value(default: object) -> str:
    """How ``default`` is written in an env file ("" for None)."""
    if default is None:
        return ""
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, dict | list):
        return json.dumps(default)
    if isinstance(default, Enum):
        return str(default.value)
    return str(default)


def comment(text: str) -> list[str]:
    """``text`` (whitespace normalised) as comment lines of at most WIDTH characters."""
    return textwrap.wrap(
        " ".join(text.split()),
        width=WIDTH,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
    )


def entry(name: str, field: FieldInfo) -> list[str]:
    """One setting: its description, then ``# ZQ_<NAME>=default``."""
    if not field.description:
        raise ValueError(f"ZQ_{name.upper()} has no description (a docstring under the field)")
    default = field.get_default(call_default_factory=True)
    return [*comment(field.description), f"# ZQ_{name.upper()}={env_value(default)}"]


def own_fields(cls: type[BaseSettings], base: type[BaseSettings] | None) -> dict[str, FieldInfo]:
    """The fields ``cls`` adds to ``base``, in declaration order."""
    inherited = set(base.model_fields) if base is not None else set()
    return {n: f for n, f in cls.model_fields.items() if n not in inherited}


def render() -> str:
    """The whole env.example."""
    lines = [HEADER.rstrip("\n")]
    base: type[BaseSettings] | None = None
    for title, cls, note in SECTIONS:
        lines += ["", f"# ---- {title} ----"]
        lines += comment(note) if note else []
        for name, field in own_fields(cls, base).items():
            lines += ["", *entry(name, field)]
        base = cls
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
