"""zettelq producer: what an agent imports to store and search memories.

Light on purpose: redis, msgpack and pydantic only (no numpy, faiss or celery).
"""

from __future__ import annotations

from producer.async_client import AsyncMemoryClient
from producer.client import MemoryClient
from producer.errors import (
    AccessDenied,
    Backpressure,
    Conflict,
    InvalidInput,
    InvalidSetting,
    JobFailed,
    NotFound,
    NotReplicated,
    OutOfMemory,
    ProtocolError,
    ReplyTimeout,
    ServerError,
    Unavailable,
    ZettelqError,
)
from producer.protocol import (
    PROTOCOL_VERSION,
    Hit,
    JobRun,
    Neighbour,
    Note,
    Organised,
    Proposal,
    Stats,
)
from producer.settings import ProducerSettings

__all__ = [
    "PROTOCOL_VERSION",
    "AccessDenied",
    "AsyncMemoryClient",
    "Backpressure",
    "Conflict",
    "Hit",
    "InvalidInput",
    "InvalidSetting",
    "JobFailed",
    "JobRun",
    "MemoryClient",
    "Neighbour",
    "NotFound",
    "NotReplicated",
    "Note",
    "Organised",
    "OutOfMemory",
    "ProducerSettings",
    "Proposal",
    "ProtocolError",
    "ReplyTimeout",
    "ServerError",
    "Stats",
    "Unavailable",
    "ZettelqError",
]
