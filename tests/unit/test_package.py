from __future__ import annotations

import inspect
import json
import subprocess
import sys

import producer
from producer import errors


def isort_style(name: str) -> tuple[int, str]:
    """ruff RUF022's order: CONSTANTS, then CamelCase, then the rest, each alphabetical."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def test_all_is_sorted() -> None:
    assert producer.__all__ == sorted(producer.__all__, key=isort_style)


def test_all_has_no_duplicates() -> None:
    assert len(set(producer.__all__)) == len(producer.__all__)


def test_every_name_in_all_is_importable_from_producer() -> None:
    for name in producer.__all__:
        assert getattr(producer, name) is not None, name


def test_every_public_error_is_exported() -> None:
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and obj.__module__ == errors.__name__ and not name.startswith("_")
    }

    assert defined
    assert defined <= set(producer.__all__)


def test_every_exported_error_is_a_zettelq_error() -> None:
    exported = [getattr(producer, n) for n in producer.__all__]
    exceptions = [obj for obj in exported if inspect.isclass(obj) and issubclass(obj, Exception)]

    assert all(issubclass(e, errors.ZettelqError) for e in exceptions)


def test_importing_producer_does_not_import_the_worker_stack() -> None:
    code = (
        "import json, sys; import producer; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'numpy', 'faiss', 'celery', 'kombu', 'worker'})))"
    )

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    assert json.loads(out.stdout) == []
