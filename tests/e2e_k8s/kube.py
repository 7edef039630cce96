"""The few Kubernetes API calls the lab and its tests make: plain HTTPS with the lab's bearer
token (urllib, no client library), and `kubectl` for what a person would type (apply)."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Json = dict[str, Any]
REQUEST_TIMEOUT_S = 10.0


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Kube:
    """The lab's apiserver at ``server`` (https://127.0.0.1:PORT, a self-signed certificate the
    apiserver made itself, so it is not verified), as the lab's admin."""

    def __init__(self, server: str, token: str, kubectl: Path | None = None,
                 kubeconfig: Path | None = None) -> None:
        self.server, self.token = server, token
        self.kubectl_path, self.kubeconfig = kubectl, kubeconfig
        self._tls = ssl._create_unverified_context()  # noqa: S323 (the lab's own self-signed apiserver)

    def request(self, method: str, path: str, body: Json | None = None,
                timeout_s: float = REQUEST_TIMEOUT_S) -> Json:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=self._tls) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except ValueError:
                pass
            raise ApiError(exc.code, detail) from None
        return json.loads(text) if text.startswith("{") else {"text": text}

    def get(self, path: str) -> Json:
        return self.request("GET", path)

    def get_if_present(self, path: str) -> Json | None:
        """The object at ``path``; None when the API server has none there (404)."""
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def readyz(self) -> bool:
        try:
            return self.request("GET", "/readyz", timeout_s=2.0).get("text") == "ok"
        except (OSError, ApiError):
            return False

    # --- nodes and pods ---------------------------------------------------------------------

    def node(self, name: str) -> Json | None:
        try:
            return self.get(f"/api/v1/nodes/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def node_schedulable(self, name: str) -> bool:
        """Ready, and without the not-ready taint the node lifecycle controller takes off."""
        node = self.node(name)
        if node is None:
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", []))
        taints = [t["key"] for t in node.get("spec", {}).get("taints", []) or []]
        return ready and "node.kubernetes.io/not-ready" not in taints

    def pod(self, name: str, namespace: str = "default") -> Json | None:
        try:
            return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, namespace: str = "default") -> list[Json]:
        return self.get(f"/api/v1/namespaces/{namespace}/pods")["items"]

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """A graceful delete, as `kubectl delete pod` does: the kubelet stops the pod, then removes
        the API object itself. (Never grace 0 on kubelet 1.20: the object goes at once and a pod
        worker still syncing may start the pod's containers again; tests/e2e_k8s/README.md.)"""
        try:
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    # --- kubectl --------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, timeout_s: float = 60.0) -> str:
        assert self.kubectl_path is not None and self.kubeconfig is not None, "no kubectl configured"
        done = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args],
                              input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def apply(self, objects: Iterable[Json]) -> str:
        """`kubectl apply -f -` of a List: the objects are created one right after the other, as
        `kubectl apply -f pods.yaml` does for a file holding several."""
        return self.kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def container_statuses(pod: Json | None) -> list[Json]:
    return [] if pod is None else pod.get("status", {}).get("containerStatuses", []) or []


def running_container_id(pod: Json | None) -> str | None:
    """The runtime's id of the pod's only container once it runs ("containerd://<id>" → id)."""
    statuses = container_statuses(pod)
    if len(statuses) != 1 or "running" not in statuses[0].get("state", {}):
        return None
    return statuses[0].get("containerID", "").split("://", 1)[-1] or None


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1,
             describe: Callable[[], str] | None = None) -> Any:
    """``condition()``'s first truthy value; TimeoutError naming ``what`` (and ``describe()``,
    the state it was waiting on) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" ({describe()})" if describe is not None else ""
            raise TimeoutError(f"{what}: not within {timeout_s:g} s{detail}")
        time.sleep(poll_s)
