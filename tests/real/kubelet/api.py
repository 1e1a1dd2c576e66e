"""A small JSON client of the real API server for the kubelet tier's checks (admin token)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"API server answered {status}: {body[:500]}")
        self.status = status


class Api:
    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self._ssl = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
    ) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=30) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:  # its response holds the connection
                raise ApiError(exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(text) if text else None

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", path, query=query or None)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, grace_seconds: int | None = None) -> None:
        body = None if grace_seconds is None else {"gracePeriodSeconds": grace_seconds}
        try:
            self.request("DELETE", path, body)
        except ApiError as exc:
            if exc.status != 404:
                raise

    # --- pods -----------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod

    def events(self, namespace: str, involved_uid: str) -> list[dict[str, Any]]:
        listed = self.get(
            f"/api/v1/namespaces/{namespace}/events",
            fieldSelector=f"involvedObject.uid={involved_uid}",
        )
        items: list[dict[str, Any]] = listed["items"]
        return items

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.get(f"/api/v1/nodes/{name}")
        return node
