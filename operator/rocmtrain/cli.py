"""The `rocmtrain` command: render and validate jobs, print the CRD, and the commands other packages add.

`render`, `validate` and `crd` are built in and need only the contract (`rocmtrain.api`)
and the renderer. Further commands come from the `rocmtrain.commands` entry-point group:
each entry point names a function that takes the rest of the command line and returns
the exit status (its docstring's first line is the help). The training package adds
`run` there, so `rocmtrain run` exists where the training package is installed and says
so clearly where it is not (the operator image); this module never imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, distributions

from rocmtrain.api.manifests import read_jobs

EXIT_INVALID = 1
EXIT_USAGE = 2
COMMANDS_GROUP = "rocmtrain.commands"

Command = Callable[[list[str]], int]


def _plugins() -> dict[str, EntryPoint]:
    """The commands other installed packages offer, by name.

    Every distribution's are read, not only the first of each name (as `entry_points()`
    does): a stale `*.egg-info` that an in-tree build left in the working directory must
    not hide the installed package's commands.
    """
    found: dict[str, EntryPoint] = {}
    for distribution in distributions():
        for point in distribution.entry_points.select(group=COMMANDS_GROUP):
            found.setdefault(point.name, point)
    return found


def _load(point: EntryPoint) -> Command | None:
    """The command's function; None when its package is not installed."""
    try:
        command: Command = point.load()
    except ModuleNotFoundError as exc:
        if exc.name is None or not point.module.startswith(exc.name):
            raise
        return None
    return command


def _parser(plugins: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocmtrain", description="Distributed Transformer fine-tuning on AMD GPUs with KubeRay."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    render = commands.add_parser("render", help="print the KubeRay RayJob of every job in a file")
    render.add_argument("file", help="job manifest (YAML, one or more documents; - reads stdin)")
    validate = commands.add_parser("validate", help="check every job in a file and report all errors")
    validate.add_argument("file", help="job manifest (YAML, one or more documents; - reads stdin)")
    validate.add_argument(
        "--context",
        choices=["cluster", "local"],
        default="cluster",
        help="where the job will run: cluster (default) or local (`rocmtrain run`, allows ./relative paths)",
    )
    commands.add_parser("crd", help="print the RocmTrainingJob CustomResourceDefinition")
    for name, command in sorted(plugins.items()):
        commands.add_parser(name, help=(command.__doc__ or "").strip().splitlines()[0], add_help=False)
    return parser


def _report(lines: list[str]) -> int:
    for line in lines:
        print(line, file=sys.stderr)
    return EXIT_INVALID


def cmd_render(args: argparse.Namespace) -> int:
    """Print one RayJob per job, as a multi-document YAML stream."""
    from rocmtrain.render import render_rayjob_yaml

    jobs, errors = read_jobs(args.file, "cluster")
    if errors:
        return _report(errors)
    sys.stdout.write("---\n".join(render_rayjob_yaml(job) for job in jobs))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Report every error with its path; one OK line when there is none."""
    jobs, errors = read_jobs(args.file, args.context)
    if errors:
        return _report(errors)
    names = ", ".join(job.metadata.name for job in jobs)
    print(f"{args.file}: OK ({names})")
    return 0


def cmd_crd(_: argparse.Namespace) -> int:
    """Print the CRD exactly as committed under crds/."""
    from rocmtrain.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


BUILT_IN = {"render": cmd_render, "validate": cmd_validate, "crd": cmd_crd}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rocmtrain` console script."""
    args = sys.argv[1:] if argv is None else argv
    points = {name: point for name, point in _plugins().items() if name not in BUILT_IN}
    if args[:1] and args[0] in points:
        command = _load(points[args[0]])
        if command is None:
            print(
                f"rocmtrain {args[0]}: the package that provides it ({points[args[0]].module.split('.')[0]}) "
                f"is not installed here; this rocmtrain offers {', '.join(BUILT_IN)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return command(args[1:])
    loaded = {name: command for name, point in points.items() if (command := _load(point)) is not None}
    parsed = _parser(loaded).parse_args(args)
    try:
        return BUILT_IN[parsed.command](parsed)
    except OSError as exc:
        print(f"rocmtrain: {exc}", file=sys.stderr)
        return EXIT_USAGE
