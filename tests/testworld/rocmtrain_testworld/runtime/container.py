"""TEST-ONLY: one container as a tree of processes on this machine, and how it is stopped.

A container runs as::

    ip netns exec <pod netns>                  the pod's network (and a fresh /sys)
      unshare --mount --uts --pid --fork --kill-child --mount-proc --propagation slave
        sh -c <mounts; hostname; exec setpriv <capabilities> -- <command line>>

so it has the pod's address, its own mounts (volumes, /etc/hosts and
/etc/resolv.conf of the pod, a private /tmp/ray and /dev/shm), the pod's
hostname, and a PID namespace of its own, whose first process is the container's
command: when that ends, the kernel ends every process of the container; and
when the runtime dies, `unshare` dies with it (PR_SET_PDEATHSIG) and takes the
container along (`--kill-child`). Nothing of a container outlives the runtime.

Every other path of this machine is visible as it is. A mount path that does not
exist here is made inside an overlay over its nearest existing folder, so the
machine's own folders are never written; such a folder may not be / or hold the
runtime's state or a volume's source.

Stopping is graceful first: SIGTERM to the container's first process and to its
children (KubeRay's containers start `bash -lc "...; ray start --block"`: bash,
PID 1 there, ignores SIGTERM, so a kubelet would wait out the grace period; the
program it runs handles it, as under an init that forwards signals), then SIGKILL
to all of them once the grace period is over.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocmtrain_testworld.processes import die_with_parent
from rocmtrain_testworld.runtime.podspec import ConfigError, HttpGet, Probe
from rocmtrain_testworld.runtime.volumes import Mount

# Ray's fixed temp folder (sessions, sockets, `ray_current_cluster`): each container gets its own
# over it; the runtime makes sure the folder exists on this machine (`ensure_ray_tmp`).
RAY_TMP = "/tmp/ray"
KILLED_BY = 128  # exit code of a process ended by signal N: 128 + N, as a container runtime reports it


@dataclass(frozen=True)
class Layout:
    """What a container sees besides its volumes: the pod's names, hostname and private folders."""

    netns: str
    hostname: str
    hosts: Path
    resolv_conf: Path
    ray_tmp: Path
    overlays: Path  # where the upper layers of overlays go
    forbidden: tuple[str, ...] = ()  # folders no overlay may cover (the runtime's state, volume sources)
    image: tuple[str, ...] = ()  # the stand-in image's folders (the checkout, its venv): kept visible


def ensure_ray_tmp() -> None:
    """Ray's temp folder exists on this machine (as Ray itself makes it: open to everyone)."""
    if not os.path.isdir(RAY_TMP):
        os.makedirs(RAY_TMP, exist_ok=True)
        os.chmod(RAY_TMP, 0o1777)  # noqa: S103 (as Ray makes it: shared, sticky)


def _nearest_existing(path: str) -> str:
    current = os.path.normpath(path)
    while not os.path.lexists(current):
        current = os.path.dirname(current)
    return os.path.realpath(current)


def _covers(folder: str, path: str) -> bool:
    return os.path.commonpath([folder, os.path.realpath(path)]) == folder


def mount_script(layout: Layout, mounts: Sequence[Mount]) -> list[str]:
    """Shell commands that set up a container's mount namespace (run as root inside it)."""
    commands = [f"hostname {shlex.quote(layout.hostname)}"]
    overlaid: list[str] = []
    for target in (m.target for m in mounts):
        if os.path.exists(target) or any(_covers(o, target) for o in overlaid if os.path.lexists(o)):
            continue
        root = _nearest_existing(target)
        bad = root == "/" or any(_covers(root, p) for p in layout.forbidden)
        if bad:
            raise ConfigError(f"mount path {target} does not exist on this machine and cannot be made under {root}")
        upper = layout.overlays / str(len(overlaid))
        (upper / "upper").mkdir(parents=True, exist_ok=True)
        (upper / "work").mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={root},upperdir={upper / 'upper'},workdir={upper / 'work'}"
        commands.append(f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(root)}")
        overlaid.append(root)
    # A mount over a folder that holds sources or the image (the pods' `/tmp` emptyDir over a runtime
    # or a checkout under /tmp) would hide them: such mounts go last, after the pod's own files are bound.
    sources = [os.path.realpath(str(source)) for source in (layout.hosts, layout.resolv_conf, layout.ray_tmp)]
    sources += [os.path.realpath(m.source) for m in mounts if m.source is not None]
    sources += [os.path.realpath(f) for f in layout.image]
    hiding = [m for m in mounts if any(_covers(os.path.realpath(m.target), s) for s in sources)]
    commands += _mount_commands([m for m in mounts if m not in hiding])
    private = [(layout.hosts, "/etc/hosts"), (layout.resolv_conf, "/etc/resolv.conf")]
    if not any(_covers(os.path.realpath(m.target), RAY_TMP) for m in hiding):
        private.append((layout.ray_tmp, RAY_TMP))  # else the mount over it is the pod's own (its /tmp)
        commands.append(f"mkdir -p {RAY_TMP}")
    commands += [f"mount --bind {shlex.quote(str(source))} {target}" for source, target in private]
    # The image lies in no real pod's /tmp: a mount that would hide it (a checkout under /tmp) gets
    # the image's folders bound back at their paths, through a bind of each made beforehand.
    hidden = [f for f in _outermost(layout.image) if any(_covers(os.path.realpath(m.target), f) for m in hiding)]
    kept = [(folder, str(layout.overlays / f"image-{i}")) for i, folder in enumerate(hidden)]
    commands += [_bind_folder(folder, stash) for folder, stash in kept]
    commands += _mount_commands(hiding)
    commands += [_bind_folder(stash, folder) for folder, stash in kept]
    if len(private) == 2:
        commands.append(f"mkdir -p {RAY_TMP}")
    return commands


def _outermost(folders: Sequence[str]) -> list[str]:
    """The folders that lie in none of the others."""
    real = sorted({os.path.realpath(f) for f in folders})
    return [f for f in real if not any(o != f and _covers(o, f) for o in real)]


def _bind_folder(source: str, target: str) -> str:
    return f"mkdir -p {shlex.quote(target)} && mount --bind {shlex.quote(source)} {shlex.quote(target)}"


def _mount_commands(mounts: Sequence[Mount]) -> list[str]:
    commands = []
    for mount in mounts:
        target = shlex.quote(mount.target)
        if mount.tmpfs_bytes is not None:
            commands.append(f"mkdir -p {target} && mount -t tmpfs -o size={mount.tmpfs_bytes} tmpfs {target}")
            continue
        assert mount.source is not None
        source = shlex.quote(mount.source)
        make = f"mkdir -p {target}" if os.path.isdir(mount.source) else f"touch {target}"
        commands.append(f"{make} && mount --bind {source} {target}")
        if mount.read_only:
            commands.append(f"mount -o remount,bind,ro {target}")
    return commands


def argv_for(
    layout: Layout,
    mounts: Sequence[Mount],
    command: Sequence[str],
    *,
    workdir: str,
    capabilities: Sequence[str],
    no_new_privileges: bool,
) -> list[str]:
    """The full command line of a container (see the module docstring)."""
    bounding = ",".join(["-all", *(f"+{c}" for c in capabilities)])
    setpriv = ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all"]
    if no_new_privileges:
        setpriv.append("--no-new-privs")
    script = " && ".join([*mount_script(layout, mounts), f"cd {shlex.quote(workdir)}", 'exec "$@"'])
    return [
        "ip", "netns", "exec", layout.netns,
        "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "slave",
        "sh", "-c", script, "container",
        *setpriv, "--", *command,
    ]  # fmt: skip


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def processes_in(namespace_link: str, kind: str = "pid") -> list[int]:
    """Every process whose `kind` namespace (pid, net) is ``namespace_link`` (as /proc/<pid>/ns/<kind> reads)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/{kind}") == namespace_link:
                    found.append(int(entry.name))
    return found


@dataclass
class Running:
    """One started container process (one attempt of a container)."""

    name: str
    popen: subprocess.Popen[bytes]
    started: float = field(default_factory=time.time)
    finished: float | None = None
    exit_code: int | None = None
    _namespace: str | None = None

    @classmethod
    def start(cls, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> Running:
        """Start it, its output appended to ``log``. Call from a thread that outlives it (PR_SET_PDEATHSIG)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"---- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} start ----\n".encode())
            out.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                preexec_fn=die_with_parent,
            )
        return cls(name, popen)

    def init_pid(self) -> int | None:
        """The container's first process (PID 1 in its namespace), once `unshare` has forked it."""
        children = _children(self.popen.pid)
        return children[0] if children else None

    def namespace(self) -> str | None:
        if self._namespace is None and (pid := self.init_pid()) is not None:
            self._namespace = _pid_namespace(pid)
        return self._namespace

    def poll(self) -> int | None:
        """The exit code once it has ended (128 + N when a signal N ended it), else None."""
        if self.exit_code is None and (code := self.popen.poll()) is not None:
            self.exit_code = KILLED_BY - code if code < 0 else code
            self.finished = time.time()
        return self.exit_code

    def terminate(self) -> None:
        """SIGTERM the container's first process and its children (see the module docstring)."""
        init = self.init_pid()
        for pid in [init, *_children(init)] if init is not None else [self.popen.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def stop(self, grace: float) -> int:
        """SIGTERM (see `terminate`), SIGKILL to every process after ``grace`` seconds; the exit code."""
        if self.poll() is None:
            self.terminate()
            deadline = time.monotonic() + grace
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.poll() is None:
            self.kill()
        assert self.exit_code is not None
        return self.exit_code

    def kill(self) -> None:
        """SIGKILL the container's first process (the kernel ends the rest) and `unshare`."""
        if (pid := self.init_pid()) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self.poll()


def probe(running: Running, found: Probe, env: Mapping[str, str], address: str) -> bool:
    """Run the probe of the container: an exec probe inside it (its network and mounts), an httpGet probe from
    this machine to the pod's ``address``, as the kubelet does; whether it passed in time."""
    if running.poll() is not None:
        return False
    if found.http is not None:
        return http_probe(address, found.http, found.timeout)
    pid = running.init_pid()
    if pid is None or found.command is None:
        return False
    command, timeout = found.command, found.timeout
    try:
        done = subprocess.run(
            ["nsenter", f"--target={pid}", "--net", "--mount", "--", *command],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def http_probe(address: str, get: HttpGet, timeout: float) -> bool:
    """GET the probe's path on the pod's address (HTTPS unverified, as the kubelet); 200 to 399 pass."""
    url = f"{'https' if get.scheme == 'HTTPS' else 'http'}://{address}:{get.port}{get.path}"
    request = urllib.request.Request(url, headers=dict(get.headers))  # noqa: S310 (http or https only)
    unverified = ssl._create_unverified_context()  # noqa: S323 (as the kubelet)
    # No proxy from the environment: the request goes to the pod and nowhere else.
    handlers = (urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=unverified))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as answer:
            return 200 <= answer.status < 400
    except (OSError, ValueError):  # refused, timed out, 4xx/5xx (HTTPError), a bad answer
        return False
