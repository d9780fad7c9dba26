"""`rocmtrain pool`, `rocmtrain status` and `rocmtrain plot`: read the cluster, show a view (`rocmtrain.views`).

They read through kubernetes_asyncio (the `operator` extra, in the operator image too) with
$KUBECONFIG or ~/.kube/config (`--kubeconfig` overrides), else the in-cluster service account;
they only read (get and list: nodes and pods cluster-wide for `pool`, the job, its pods and
events for `status`, Kueue's queues and workloads where it is installed). `plot` draws with
matplotlib (the `plot` extra) and also reads a local run's `metrics.jsonl`.
Exit status: 0 shown, 1 not found or unreadable, 2 a missing package or bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import GROUP, JOB_NAME_LABEL, KIND, PLURAL, VERSION
from rocmtrain.api.errors import ConfigError, NotFound

EXIT_FAILED = 1
EXIT_USAGE = 2
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # the newest Kueue serves first


class Cluster:
    """Read-only access to the objects the views need."""

    def __init__(self, api: Any) -> None:
        from kubernetes_asyncio import client

        self._api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    async def _raw(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The response as the API server wrote it (camelCase), not as client model objects."""
        response = await call(*args, _preload_content=False, **kwargs)
        return json.loads(await response.read())

    async def nodes(self) -> list[dict[str, Any]]:
        return (await self._raw(self._core.list_node))["items"]

    async def pods(self, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        kwargs = {"label_selector": selector} if selector else {}
        if namespace is None:
            return (await self._raw(self._core.list_pod_for_all_namespaces, **kwargs))["items"]
        return (await self._raw(self._core.list_namespaced_pod, namespace, **kwargs))["items"]

    async def jobs(self) -> list[dict[str, Any]]:
        return (await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))["items"]

    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(f"no RocmTrainingJob {namespace}/{name}") from None
            raise

    async def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind={KIND}"
        return (await self._raw(self._core.list_namespaced_event, namespace, field_selector=selector))["items"]

    async def kueue(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]] | None:
        """(ClusterQueues, LocalQueues, Workloads) in the newest Kueue API served; None without Kueue."""
        from kubernetes_asyncio.client.exceptions import ApiException

        for version in KUEUE_VERSIONS:
            try:
                queues = await self._custom.list_cluster_custom_object(KUEUE_GROUP, version, "clusterqueues")
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            local = await self._custom.list_cluster_custom_object(KUEUE_GROUP, version, "localqueues")
            workloads = await self._custom.list_cluster_custom_object(KUEUE_GROUP, version, "workloads")
            return queues["items"], local["items"], workloads["items"]
        return None


async def _with_cluster(kubeconfig: str | None, work: Callable[[Cluster], Awaitable[int]]) -> int:
    from rocmtrain.kube.client import Kube

    try:
        kube = await Kube.connect(kubeconfig=kubeconfig)
    except Exception as exc:  # kubernetes_asyncio's loader fails in ways of its own on a malformed file
        said = " ".join(str(exc).split())  # one line, whatever the loader said
        raise ConfigError(f"cannot load the cluster's configuration: {type(exc).__name__}: {said}") from exc
    try:
        return await work(Cluster(kube.api))
    finally:
        await kube.close()


def _run(args: argparse.Namespace, work: Callable[[Cluster], Awaitable[int]]) -> int:
    try:
        from kubernetes_asyncio.config import ConfigException
    except ModuleNotFoundError:
        print(
            "error: this command needs the `operator` extra: pip install 'rocm-train-operator[operator]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import yaml

    from rocmtrain.kube.client import API_ERRORS

    # A bad kubeconfig, the API server's refusals, no connection: said in one line; a bug is not caught.
    unreadable: tuple[type[Exception], ...] = (*API_ERRORS, ConfigException, yaml.YAMLError)
    try:
        return asyncio.run(_with_cluster(args.kubeconfig, work))
    except (NotFound, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except unreadable as exc:
        print(f"error: cannot read the cluster: {getattr(exc, 'reason', None) or exc}", file=sys.stderr)
        return EXIT_FAILED


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"rocmtrain {prog}", description=description)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    return parser


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- pool ---------------------------------------------------------------------------------


def pool(argv: list[str]) -> int:
    """show the AMD GPU pool per GPU model: free GPUs, who holds the rest, Kueue quotas"""
    from rocmtrain.views.pool import pool_text, pool_view

    parser = _parser("pool", "The AMD GPU pool per GPU model: GPUs free, their holders, Kueue's queues.")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    args = parser.parse_args(argv)

    async def show(cluster: Cluster) -> int:
        nodes, pods, jobs, kueue = await asyncio.gather(
            cluster.nodes(), cluster.pods(), cluster.jobs(), cluster.kueue()
        )
        view = pool_view(nodes, pods, jobs, kueue)
        if args.output == "json":
            print(json.dumps(dataclasses.asdict(view), indent=2))
        else:
            sys.stdout.write(pool_text(view))
        return 0

    return _run(args, show)


# ---- status -------------------------------------------------------------------------------


def _job_ref(value: str, namespace: str) -> tuple[str, str]:
    """`name` in `namespace`, or `namespace/name`."""
    ns, _, name = value.rpartition("/")
    return (ns or namespace), name


def status(argv: list[str]) -> int:
    """show one job on one screen: phase, conditions, progress, metrics, GPUs, events"""
    from rocmtrain.views.job import job_text

    parser = _parser("status", "One RocmTrainingJob on one screen.")
    parser.add_argument("job", help="job name, or NAMESPACE/NAME")
    parser.add_argument("-n", "--namespace", default="default", help="namespace of the job (default: default)")
    args = parser.parse_args(argv)
    namespace, name = _job_ref(args.job, args.namespace)

    async def show(cluster: Cluster) -> int:
        job = await cluster.job(namespace, name)
        pods, events, nodes = await asyncio.gather(
            cluster.pods(namespace, f"{JOB_NAME_LABEL}={name}"), cluster.events(namespace, name), cluster.nodes()
        )
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        sys.stdout.write(job_text(job, pods, events, labels, _now()))
        return 0

    return _run(args, show)


# ---- plot ---------------------------------------------------------------------------------


def _local_log(source: str) -> Path | None:
    """The metrics.jsonl a local source names (the file, a run's logs folder, or the run folder), else None."""
    path = Path(source)
    for candidate in (path, path / "metrics.jsonl", path / "logs" / "metrics.jsonl"):
        if candidate.is_file():
            return candidate
    return None


def plot(argv: list[str]) -> int:
    """draw the loss and accuracy curves of jobs (or local runs) into a PNG"""
    parser = _parser("plot", "Loss and accuracy curves of cluster jobs (status.history) or local runs, as a PNG.")
    parser.add_argument(
        "sources", nargs="+", metavar="JOB", help="job name or NAMESPACE/NAME, or a local run's metrics.jsonl or folder"
    )
    parser.add_argument("-n", "--namespace", default="default", help="namespace of the jobs named (default: default)")
    parser.add_argument("-o", "--output", type=Path, default=Path("curves.png"), help="PNG file (default curves.png)")
    parser.add_argument("--title", default="Training curves", help="figure title")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401 - only to say clearly when it is missing
    except ModuleNotFoundError:
        print("error: rocmtrain plot needs the `plot` extra: pip install 'rocm-train-operator[plot]'", file=sys.stderr)
        return EXIT_USAGE
    from rocmtrain.cli.plot import draw_curves
    from rocmtrain.views.curves import Curves, from_history, from_reports

    local = {source: _local_log(source) for source in args.sources}
    remote = [source for source, path in local.items() if path is None]

    def finish(curves: list[Curves]) -> int:
        if empty := [c.label for c in curves if c.empty]:
            print(f"error: no loss or accuracy recorded yet for {', '.join(empty)}", file=sys.stderr)
            return EXIT_FAILED
        draw_curves(curves, args.output, args.title)
        print(f"wrote {args.output}")
        return 0

    def read_local(path: Path) -> Curves:
        """A run's curves, named as its job (`runs/NAME/logs/metrics.jsonl`)."""
        name = path.parent.parent.name if path.parent.name == "logs" else path.stem
        return from_reports(name, path.read_text(encoding="utf-8").splitlines())

    if not remote:
        return finish([read_local(path) for path in local.values() if path is not None])

    async def collect(cluster: Cluster) -> int:
        curves = []
        for source, path in local.items():
            if path is not None:
                curves.append(read_local(path))
                continue
            namespace, name = _job_ref(source, args.namespace)
            job = await cluster.job(namespace, name)
            curves.append(from_history(f"{namespace}/{name}", (job.get("status") or {}).get("history") or []))
        return finish(curves)

    return _run(args, collect)
