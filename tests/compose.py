"""deploy/compose.yaml as the tests read it: its services, and each healthcheck as a command
this machine can run (Docker images cannot be pulled here, so the tests run the commands
themselves, with compose's variable interpolation applied to them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
#: ${NAME}, ${NAME:-default} and ${NAME-default}, as compose interpolates them
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return compose["services"]


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` as compose passes it on: variables substituted from ``env``, ``$$`` -> ``$``."""

    def value(m: re.Match[str]) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        got = env.get(name)
        if got is None or (op == ":-" and got == ""):
            return default if op else ""
        return got

    parts = text.split("$$")
    return "$".join(VARIABLE.sub(value, part) for part in parts)


def environment(service: str, env: dict[str, str]) -> dict[str, str]:
    """The variables compose.yaml sets in the service's container, interpolated from ``env``."""
    declared = services()[service].get("environment") or {}
    return {k: interpolate(str(v), env) for k, v in declared.items()}


def healthcheck_argv(service: str, env: dict[str, str]) -> list[str]:
    """The service's healthcheck ``test`` as an argv (CMD-SHELL runs under ``sh -c``)."""
    kind, *rest = services()[service]["healthcheck"]["test"]
    rest = [interpolate(part, env) for part in rest]
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


def run_healthcheck(
    service: str, env: dict[str, str], container_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run the service's healthcheck here, in the environment its container would have:
    ``container_env`` plus what compose.yaml sets, interpolated from ``env`` (the shell's)."""
    full = {**container_env, **environment(service, env)}
    return subprocess.run(
        healthcheck_argv(service, env), env=full, capture_output=True, text=True, timeout=60
    )
