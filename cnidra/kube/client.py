"""apiserver clients. Every call has a timeout; nothing here is used on the NRI hook path."""

from __future__ import annotations

import httpx2
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

FIELD_MANAGER = "cnidra"


def make_client(kubeconfig: str | None, timeout: float = 10.0) -> AsyncClient:
    """From a kubeconfig file, or the in-cluster service account when none is given."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return AsyncClient(config=config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER)
