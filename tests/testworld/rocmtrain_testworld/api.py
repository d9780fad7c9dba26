"""The test cluster as the tests see it: REST calls, apply/create/delete, namespaces, CRDs.

Works the same on the local cluster (``control_plane.start``) and on an
external one ($ROCMTRAIN_TEST_KUBECONFIG).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from rocmtrain_testworld.pki import Pki
from rocmtrain_testworld.processes import ClusterError, Process, stop_all

FIELD_MANAGER = "rocmtrain-tests"
# libyaml parses KubeRay's multi-MB CRDs ~10x faster than the pure-Python loader.
_YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    query: dict[str, str] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30,
) -> dict[str, Any]:
    """Send one REST call; return the decoded JSON body, raise ApiException on non-2xx."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
        # The REST layer JSON-encodes bodies sent as JSON; other types go as text.
        if "json" not in content_type and not isinstance(body, (str, bytes)):
            body = json.dumps(body)
    _m, url, hdrs, ser_body, _ = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list((query or {}).items()),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=hdrs, body=ser_body, _request_timeout=timeout)
    resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=resp.data.decode(errors="replace"), data=None)
    return json.loads(resp.data) if resp.data else {}


def api_message(err: ApiException) -> str:
    """The ``message`` of a Status body, else the raw body."""
    try:
        return str(json.loads(err.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.body or err)


def load_documents(source: str | Path | dict[str, Any] | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Objects from a YAML file path, a YAML string, a dict or a list of dicts."""
    if isinstance(source, dict):
        return [source]
    if isinstance(source, Path):
        source = source.read_text()
    docs = list(yaml.load_all(source, Loader=_YamlLoader)) if isinstance(source, str) else list(source)
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not doc:
            continue
        if doc.get("kind", "").endswith("List") and "items" in doc:
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def load_cached(path: Path) -> list[dict[str, Any]]:
    """:func:`load_documents` of a YAML file through a JSON cache beside it."""
    cached = path.with_name(f".{path.name}.json")
    try:
        if cached.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            return list(json.loads(cached.read_text()))
    except (OSError, ValueError):
        pass
    docs = load_documents(path)
    with contextlib.suppress(OSError):
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}")
        tmp.write_text(json.dumps(docs))
        tmp.replace(cached)
    return docs


class KubeCluster:
    """A running (local or external) cluster, as the tests see it."""

    def __init__(self, kubeconfig: Path, *, workdir: Path | None = None, external: bool = False) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.external = external
        self.processes: dict[str, Process] = {}
        self.fake_nodes: list[str] = []
        self.crd_errors: dict[str, str] = {}
        self.namespaces: list[str] = []
        self.pki: Pki | None = None  # the local cluster's CA, to issue component credentials
        self._resources: dict[str, list[dict[str, Any]]] = {}
        self._api: k8s.ApiClient | None = None
        self._api_lock = threading.Lock()
        self._stopped = False
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.server: str = cfg.host

    # ---- clients ------------------------------------------------------------

    def api_client(self) -> k8s.ApiClient:
        """A new sync ``kubernetes`` ApiClient for this cluster (close it when done)."""
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    @property
    def api(self) -> k8s.ApiClient:
        """A shared ApiClient owned by this object."""
        with self._api_lock:
            if self._api is None:
                self._api = self.api_client()
            return self._api

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Generic REST call on the shared client; see :func:`request`."""
        return request(self.api, method, path, **kwargs)

    def printed(self, path: str) -> dict[str, Any]:
        """The object at ``path`` as `kubectl get` prints it: the API server's Table row, by column name."""
        resp = self.api.rest_client.request(
            "GET", self.server + path, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
        )
        table = json.loads(resp.read())
        return dict(zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"], strict=True))

    # ---- apply -------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> dict[str, Any]:
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        for refresh in (False, True):
            if refresh or api_version not in self._resources:
                try:
                    self._resources[api_version] = self.request("GET", base)["resources"]
                except ApiException as e:
                    if e.status != 404 or refresh:
                        raise
                    self._resources[api_version] = []
                    continue
            for res in self._resources[api_version]:
                if res["kind"] == kind and "/" not in res["name"]:
                    return {"base": base, **res}
        raise ClusterError(f"no resource for {api_version} {kind} on {self.server}")

    def path_for(self, obj: dict[str, Any], namespace: str | None = None, *, named: bool = True) -> str:
        """REST path of ``obj`` (its collection when ``named`` is False)."""
        res = self._resource(obj["apiVersion"], obj["kind"])
        path = res["base"]
        if res["namespaced"]:
            ns = obj.get("metadata", {}).get("namespace") or namespace or "default"
            path += f"/namespaces/{ns}"
        path += f"/{res['name']}"
        if named:
            path += f"/{obj['metadata']['name']}"
        return path

    def apply(
        self,
        source: str | Path | dict[str, Any] | Iterable[dict[str, Any]],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """Server-side apply every object in ``source`` (YAML text, file, dict(s))."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        return [
            self.request(
                "PATCH",
                self.path_for(obj, namespace),
                query=query,
                body=obj,
                content_type="application/apply-patch+yaml",
            )
            for obj in load_documents(source)
        ]

    apply_yaml = apply

    def create(self, obj: dict[str, Any], namespace: str | None = None, *, dry_run: bool = False) -> dict[str, Any]:
        """POST one object; raises ApiException (e.g. 422 on validation errors)."""
        query = {"fieldManager": FIELD_MANAGER}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("POST", self.path_for(obj, namespace, named=False), query=query, body=obj)

    def delete(self, obj: dict[str, Any], namespace: str | None = None, *, propagation: str = "Background") -> None:
        """Delete one object (ignored when already gone)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        with contextlib.suppress(ApiException):
            self.request("DELETE", self.path_for(obj, namespace), body=body)

    def new_namespace(self, prefix: str = "test", annotations: Mapping[str, str] | None = None) -> str:
        """Create a uniquely named namespace (with ``annotations``) and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        metadata = {"name": name, "annotations": dict(annotations or {})}
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})
        self.namespaces.append(name)
        return name

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path, seconds: int = 7200) -> Path:
        """Write a standalone kubeconfig holding a TokenRequest token of `namespace/account` to `path`."""
        token = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )["status"]["token"]
        cluster = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]
        if "certificate-authority" in cluster:  # inline a CA file, so the kubeconfig stands alone
            ca = Path(cluster.pop("certificate-authority")).read_bytes()
            cluster = {**cluster, "certificate-authority-data": base64.b64encode(ca).decode()}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": "cluster", "user": account}}],
            "current-context": account,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # ---- bootstrap ----------------------------------------------------------

    def install_crds(
        self,
        sources: Iterable[Path | dict[str, Any]],
        timeout: float = 60,
        errors: dict[str, str] | None = None,
        *,
        cache: bool = False,
    ) -> list[str]:
        """Apply CRDs (files of them, or CRD objects) and wait until each is Established; return their names.

        With ``errors``, a source the server rejects is recorded there (file or
        CRD name -> server message) instead of raising. ``cache`` keeps a parsed
        JSON copy beside each file (for the large KubeRay CRDs in the binaries folder).
        """

        def install(source: Path | dict[str, Any]) -> list[dict[str, Any]]:
            if isinstance(source, dict):
                docs, label = [source], source["metadata"]["name"]
            else:
                docs, label = load_cached(source) if cache else load_documents(source), source.name
            try:
                for obj in docs:
                    self.apply(obj)
            except ApiException as e:
                if errors is None:
                    raise
                errors[label] = api_message(e)
                return []
            return docs

        # In parallel: the apiserver spends its time per CRD, and has 2+ cores.
        with ThreadPoolExecutor(max_workers=4) as pool:
            crds = [crd for docs in pool.map(install, sources) for crd in docs]
        # Established CRDs (and only those) are listed in discovery; polling it
        # is far cheaper than re-reading multi-MB CRD objects.
        wanted = {
            (f"/apis/{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["plural"])
            for crd in crds
            for v in crd["spec"]["versions"]
            if v.get("served", True)
        }

        def established() -> bool:
            for base, plural in sorted(wanted):
                if plural not in {r["name"] for r in self.request("GET", base)["resources"]}:
                    return False
                wanted.discard((base, plural))
            return True

        names = [crd["metadata"]["name"] for crd in crds]
        self.wait_for(established, timeout, f"CRDs to be Established: {names}", interval=0.05)
        self._resources.clear()

        # The apiserver builds a CRD's validators on its first request (seconds
        # for KubeRay's); do that here, in parallel, rather than in some test.
        def warm(crd: dict[str, Any]) -> None:
            version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served", True))
            plural = crd["spec"]["names"]["plural"]
            self.request("GET", f"/apis/{crd['spec']['group']}/{version}/{plural}", query={"limit": "1"})

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(warm, crds))
        return names

    def register_fake_nodes(self, count: int = 2, gpus: int = 8) -> list[str]:
        """Create ``count`` Ready MI300X nodes (``gpus`` x ``amd.com/gpu``) that no kubelet runs."""
        from rocmtrain_testworld import nodes

        self.fake_nodes = nodes.register_plain(self, count, gpus)
        return self.fake_nodes

    def wait_for(self, check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
        """Poll ``check`` until it returns something truthy, and return that; ClusterError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(ApiException):
                if value := check():
                    return value
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)

    # ---- lifecycle -----------------------------------------------------------

    def stop(self) -> None:
        """Local: stop the processes and remove the workdir. External: delete what tests created here."""
        if self._stopped:
            return
        self._stopped = True
        if self.external:  # leave the cluster as found, but for the CRDs
            for name in self.namespaces:
                self.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            for name in self.fake_nodes:
                self.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
        if self.external:
            return
        stop_all(list(self.processes.values()))
        if self.workdir is not None and self.workdir.name.startswith("rocmtrain-kube-"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
