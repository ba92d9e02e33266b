"""Helpers of the serving rehearsal tests: layouts over a private deployment, and requests."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass

from pd_testlib import recap
from rehearsal_deployment import API_KEY, Deployment, private_deployment

__all__ = ["API_KEY", "Deployment", "Layouts", "private_deployment"]


@dataclass
class Layouts:
    """A private deployment and the reserved ports its test's layouts put instances on."""

    deployment: Deployment
    ports: list[int]

    def pids(self) -> dict[str, int]:
        return self.deployment.pids()

    def stop(self) -> None:
        self.deployment.stop()


def post_json(
    url: str, body: dict, timeout: float = 10, api_key: str | None = API_KEY
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def changed_count(result: subprocess.CompletedProcess) -> int:
    return recap(result.stdout)["changed"]
