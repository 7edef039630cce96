"""Keeps one NodeResourceTopology object in the API server equal to what the node has.

Only the fields nri-numa owns are compared and written: ``zones``, ``attributes``,
``topologyPolicies``, its labels and annotations, and the owner reference to the Node. Labels and
annotations others put on the object stay. A write after a write of our own reuses the
resourceVersion it got back (one API call per change); a conflict, or the periodic check, reads
the object first.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION

OWNED_FIELDS = ("zones", "attributes", "topologyPolicies")
REQUEST_TIMEOUT = (2.0, 4.0)  # seconds: connect, read; a retry never outlasts the next wait


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NrtApi(Protocol):
    """The calls the writer makes (KubernetesNrtApi below; tests may pass their own)."""

    def get(self, name: str) -> dict[str, Any] | None: ...
    def create(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def replace(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def node_uid(self, name: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class WriteResult:
    action: str  # "created", "updated", "unchanged"
    mended: bool = False  # the object read back was not the one we last wrote


class NrtWriter:
    def __init__(self, api: NrtApi) -> None:
        self._api = api
        self._written: dict[str, Any] | None = None  # the object as we last wrote or read it
        self._node_uid: str | None = None

    def ensure(self, desired: dict[str, Any], *, read_first: bool = False) -> WriteResult:
        """Make the object in the API server carry ``desired``'s owned fields. ApiError when
        the server refuses or does not answer."""
        name = desired["metadata"]["name"]
        if self._node_uid is None:
            self._node_uid = self._api.node_uid(name)
        previous = current = self._written
        if read_first or current is None or current["metadata"]["name"] != name:
            current = self._api.get(name)
        mended = (previous is not None and current is not None
                  and _owned(current) != _owned(previous))
        if current is None:
            created = self._api.create(self._with_owner(copy.deepcopy(desired)))
            self._written = created
            return WriteResult("created")
        merged = self._merged(current, desired)
        if merged == current:
            self._written = current
            return WriteResult("unchanged")
        try:
            updated = self._api.replace(name, merged)
        except ApiError as e:
            if e.status != 409:  # 409: someone else wrote since we read; read and try once more
                raise
            current = self._api.get(name)
            if current is None:
                updated = self._api.create(self._with_owner(copy.deepcopy(desired)))
            else:
                updated = self._api.replace(name, self._merged(current, desired))
        self._written = updated
        return WriteResult("updated", mended)

    @property
    def owned_by_node(self) -> bool:
        """Whether the Node was found (its uid is in the owner reference)."""
        return self._node_uid is not None

    def forget(self) -> None:
        """The next write reads the object first (after an error: it may have changed)."""
        self._written = None

    def _merged(self, current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
        merged = copy.deepcopy(current)
        for key in OWNED_FIELDS:
            if key in desired:
                merged[key] = copy.deepcopy(desired[key])
            else:
                merged.pop(key, None)
        meta, wanted = merged.setdefault("metadata", {}), desired["metadata"]
        for part in ("labels", "annotations"):
            if wanted.get(part):
                meta[part] = {**(meta.get(part) or {}), **wanted[part]}
        return self._with_owner(merged)

    def _with_owner(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self._node_uid is not None:
            name = obj["metadata"]["name"]
            owners = [o for o in obj["metadata"].get("ownerReferences") or []
                      if not (o.get("kind") == "Node" and o.get("apiVersion") == "v1")]
            owners.append({"apiVersion": "v1", "kind": "Node", "name": name,
                           "uid": self._node_uid})
            obj["metadata"]["ownerReferences"] = owners
        return obj


def _owned(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta = obj.get("metadata", {})
    return (*(obj.get(key) for key in OWNED_FIELDS), meta.get("labels"), meta.get("annotations"),
            meta.get("ownerReferences"))


class KubernetesNrtApi:
    """NrtApi through the maintained ``kubernetes`` client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, name)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, body)

    def replace(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._custom.replace_cluster_custom_object, GROUP, VERSION, PLURAL,
                          name, body)

    def node_uid(self, name: str) -> str | None:
        """The Node's uid for the owner reference; None while there is no such Node."""
        try:
            node = self._call(self._core.read_node, name)
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return node.metadata.uid

    @staticmethod
    def _call(method: Any, *args: Any) -> Any:
        return call_api(method, *args)


def call_api(method: Any, *args: Any, **kwargs: Any) -> Any:
    """``method(*args, **kwargs)`` of the ``kubernetes`` client, bounded by REQUEST_TIMEOUT; an
    ApiError with one line (the status and the server's message) when it fails."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return method(*args, **kwargs, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as e:
        raise ApiError(e.status or 0, f"{e.status} {e.reason}: {_body_message(e.body)}") from None
    except (HTTPError, OSError) as e:
        raise ApiError(0, f"no answer: {str(e)[:300]}") from None


def _body_message(body: Any) -> str:
    import json

    try:
        return str(json.loads(body).get("message", ""))[:300]
    except (TypeError, ValueError, AttributeError):
        return str(body or "")[:300]
