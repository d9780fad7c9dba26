"""TEST-ONLY: a pod's volumes as files in a folder of its own, and the mounts of each container.

What a kubelet's volume plugins would do, for the sources our pods and a person's
hand-made ones use:

- configMap, secret, downwardAPI and projected volumes (service-account tokens
  from the TokenRequest API, bound to the pod, with the pod's audience and expiry;
  ConfigMap and Secret items; downward-API items): files in `<pod>/volumes/<name>`,
  bind-mounted at the mount path; tokens are renewed at 80% of their lifetime;
- emptyDir: a folder of the pod's own, or with `medium: Memory` a tmpfs of its
  `sizeLimit` (one per container here, not shared between a pod's containers);
- persistentVolumeClaim (bound to a hostPath or local PV) and hostPath: that
  path of this machine; mounted where the pod asks, and left as it is where the
  mount path is that very path (the e2e tests and `make demo` mount their
  storage that way, standing in for a shared volume).

A ConfigMap, Secret or claim that is not there yet keeps the pod waiting
(`Missing`), as it keeps a kubelet retrying, unless the source is optional.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.runtime.podspec import ConfigError, field_value, resource_value

TOKEN_REFRESH_SHARE = 0.8
DEFAULT_TOKEN_SECONDS = 3600


class Missing(Exception):
    """An object a volume or the environment needs does not exist (yet)."""


@dataclass(frozen=True)
class Mount:
    """One mount of a container: a bind of ``source``, or a tmpfs of ``tmpfs_bytes`` when that is set."""

    target: str
    source: str | None = None
    read_only: bool = False
    tmpfs_bytes: int | None = None


def _decode(obj: Mapping[str, Any], kind: str) -> dict[str, bytes]:
    """A ConfigMap's or Secret's keys with their bytes."""
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    found = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    found.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return found


class Objects:
    """ConfigMaps and Secrets of one namespace, read through the API."""

    def __init__(self, api: KubeCluster, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def read(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        """`kind` is configMap or secret (any spelling of a reference's kind)."""
        plural = "secrets" if kind.lower().startswith("secret") else "configmaps"
        try:
            obj = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        except ApiException as exc:
            if exc.status != 404:
                raise
            if optional:
                return None
            raise Missing(f'{plural[:-1]} "{name}" not found') from None
        return _decode(obj, "secret" if plural == "secrets" else "configmap")

    def key(self, kind: str, name: str, key: str, optional: bool) -> str | None:
        """One key (for `valueFrom`), None when optional and absent."""
        found = self.read(kind, name, optional)
        if found is None or key not in found:
            if optional:
                return None
            raise Missing(f'couldn\'t find key {key} in {kind.removesuffix("KeyRef")} "{name}"')
        return found[key].decode()

    def keys(self, kind: str, name: str, optional: bool) -> dict[str, str]:
        """Every key (for `envFrom`)."""
        return {k: v.decode() for k, v in (self.read(kind, name, optional) or {}).items()}


def write_whole(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode if mode is not None else 0o644)
    os.replace(tmp, path)


class Volumes:
    """The volumes of one pod: written once before its containers start, tokens renewed while it runs."""

    def __init__(self, api: KubeCluster, pod: dict[str, Any], folder: Path, allocatable: Mapping[str, str]) -> None:
        self.api = api
        self.pod = pod
        self.folder = folder
        self.allocatable = allocatable
        self.objects = Objects(api, pod["metadata"]["namespace"])
        self._host_paths: dict[str, str] = {}  # volume name -> this machine's path (claims, hostPath)
        self._tmpfs: dict[str, int] = {}  # volume name -> bytes
        self._tokens: list[tuple[Path, dict[str, Any], float]] = []  # (file, source, renew at)

    def prepare(self) -> None:
        """Write every volume; raise Missing while something it needs does not exist."""
        for volume in self.pod["spec"].get("volumes") or []:
            self._prepare(volume)

    def _dir(self, name: str) -> Path:
        path = self.folder / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _prepare(self, volume: Mapping[str, Any]) -> None:
        name = volume["name"]
        if (source := volume.get("emptyDir")) is not None:
            if source.get("medium") == "Memory":
                self._tmpfs[name] = self._bytes(source.get("sizeLimit") or self.allocatable.get("memory", "1Gi"))
            else:
                self._dir(name)
        elif (source := volume.get("configMap")) is not None:
            self._keys(self._dir(name), "configMap", source)
        elif (source := volume.get("secret")) is not None:
            self._keys(self._dir(name), "secret", {**source, "name": source.get("secretName")})
        elif (source := volume.get("downwardAPI")) is not None:
            self._downward(self._dir(name), source)
        elif (source := volume.get("projected")) is not None:
            self._projected(self._dir(name), source)
        elif (source := volume.get("persistentVolumeClaim")) is not None:
            self._host_paths[name] = self._claim_path(source["claimName"])
        elif (source := volume.get("hostPath")) is not None:
            self._host_paths[name] = source["path"]
        else:
            raise ConfigError(f"volume {name}: its source is not one the process runtime provides")

    @staticmethod
    def _bytes(quantity: str) -> int:
        from rocmtrain.api.quantity import parse_quantity

        return int(parse_quantity(str(quantity)))

    def _keys(self, folder: Path, kind: str, source: Mapping[str, Any], default_mode: int | None = None) -> None:
        found = self.objects.read(kind, source["name"], bool(source.get("optional")))
        if found is None:
            return
        mode = source.get("defaultMode", default_mode)
        items = source.get("items") or [{"key": key, "path": key} for key in sorted(found)]
        for item in items:
            if item["key"] not in found:
                if source.get("optional"):
                    continue
                raise Missing(f'{kind} "{source["name"]}" has no key {item["key"]}')
            write_whole(folder / item["path"], found[item["key"]], item.get("mode", mode))

    def _downward(self, folder: Path, source: Mapping[str, Any]) -> None:
        containers = {c["name"]: c for c in self.pod["spec"]["containers"]}
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            else:
                ref = item["resourceFieldRef"]
                container = containers.get(ref.get("containerName")) or self.pod["spec"]["containers"][0]
                value = resource_value(container, ref, self.allocatable)
            write_whole(folder / item["path"], value.encode(), item.get("mode", source.get("defaultMode")))

    def _projected(self, folder: Path, source: Mapping[str, Any]) -> None:
        mode = source.get("defaultMode")
        for part in source.get("sources") or []:
            if "serviceAccountToken" in part:
                token = part["serviceAccountToken"]
                self._token(folder / token["path"], token)
            elif "configMap" in part:
                self._keys(folder, "configMap", part["configMap"], mode)
            elif "secret" in part:
                self._keys(folder, "secret", part["secret"], mode)
            elif "downwardAPI" in part:
                self._downward(folder, {"defaultMode": mode, **part["downwardAPI"]})
            else:
                raise ConfigError(f"projected source {sorted(part)} is not one the process runtime provides")

    def _token(self, path: Path, source: Mapping[str, Any]) -> None:
        """A TokenRequest token of the pod's service account, bound to the pod (renewed by `refresh`)."""
        meta = self.pod["metadata"]
        seconds = int(source.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        made = self.api.request(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        write_whole(path, made["status"]["token"].encode(), 0o600)
        renew = time.monotonic() + TOKEN_REFRESH_SHARE * seconds
        self._tokens = [t for t in self._tokens if t[0] != path] + [(path, dict(source), renew)]

    def refresh(self) -> None:
        """Renew the tokens that have lived 80% of their time."""
        now = time.monotonic()
        for path, source, renew in list(self._tokens):
            if now >= renew:
                self._token(path, source)

    def _claim_path(self, claim: str) -> str:
        namespace = self.pod["metadata"]["namespace"]
        try:
            pvc = self.api.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        except ApiException as exc:
            if exc.status == 404:
                raise Missing(f'persistentvolumeclaim "{claim}" not found') from None
            raise
        volume = (pvc.get("spec") or {}).get("volumeName")
        if (pvc.get("status") or {}).get("phase") != "Bound" or not volume:
            raise Missing(f'persistentvolumeclaim "{claim}" is not bound')
        pv = self.api.request("GET", f"/api/v1/persistentvolumes/{volume}")["spec"]
        path = (pv.get("hostPath") or pv.get("local") or {}).get("path")
        if not path:
            raise ConfigError(f"persistentvolume {volume}: only hostPath and local volumes are on this machine")
        return str(path)

    def mounts(self, container: Mapping[str, Any]) -> list[Mount]:
        """The container's mounts, parents before children."""
        found = []
        for mount in container.get("volumeMounts") or []:
            name, target = mount["name"], mount["mountPath"]
            read_only = bool(mount.get("readOnly"))
            sub = mount.get("subPath") or ""
            if name in self._tmpfs:
                found.append(Mount(target, tmpfs_bytes=self._tmpfs[name]))
                continue
            base = self._host_paths.get(name) or str(self.folder / "volumes" / name)
            source = os.path.join(base, sub) if sub else base
            if os.path.normpath(source) == os.path.normpath(target) and not read_only:
                continue  # this machine's own path, where the pod expects it
            found.append(Mount(target, source=source, read_only=read_only))
        return sorted(found, key=lambda m: m.target.rstrip("/").count("/"))
