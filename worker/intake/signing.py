"""Signature checks on the worker side (see producer.signing for the scheme).

With ``require_signatures`` on, a job is accepted only when it carries, for each namespace it
names, an HMAC made with that namespace's key from ``namespace_keys``. A signature proves that
the sender holds the namespace's key; it does not stop a replay of a captured job, and it does
not guard Redis itself: direct reads (get, connected, stats) need Redis ACLs.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from producer import signing
from worker.errors import SignatureRejected
from worker.settings import WorkerSettings


def check_signature(settings: WorkerSettings, payload: bytes, namespaces: Sequence[str]) -> None:
    """Raise SignatureRejected unless signatures are off or ``payload`` verifies for all of
    ``namespaces``. ``payload`` is a job that has already decoded."""
    if not settings.require_signatures:
        return
    keys = {ns: key.get_secret_value() for ns, key in settings.namespace_keys.items()}
    bad = signing.unverified(msgpack.unpackb(payload, raw=False), namespaces, keys)
    if bad:
        raise SignatureRejected(
            f"signature: not signed with the key of namespace {', '.join(map(repr, bad))}"
        )
