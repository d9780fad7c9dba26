"""The `rocmtrain` command: render, validate and plan jobs, print the CRD, and the commands other packages add.

`render`, `validate`, `plan` and `crd` are built in and need only the contract (`rocmtrain.api`)
and the renderer. Further commands come from the `rocmtrain.commands` entry-point group:
each entry point names a function that takes the rest of the command line and returns
the exit status (its docstring's first line is the help). The training package adds
`run` there, so `rocmtrain run` exists where the training package is installed and says
so clearly where it is not (the operator image); this module never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, distributions
from pathlib import Path
from typing import Any

import yaml

from rocmtrain.admission.policy import Policy
from rocmtrain.admission.policy_env import policy_from_env
from rocmtrain.api.errors import ConfigError
from rocmtrain.api.manifests import ManifestError, decode, read_jobs, read_text, yaml_problem
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.plan.gpu_memory import INSTINCT_GIB, GpuMemory, job_gpu_memory, table_gpu_memory

EXIT_INVALID = 1
EXIT_DOES_NOT_FIT = 1
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
    validate.add_argument(
        "--policy",
        metavar="FILE",
        help="the operator's settings as NAME=value lines (`kubectl set env deployment/rocm-train-operator --list "
        "-n rocm-train-system`), whose limits and allow-lists a cluster job must meet; default: the ROCMTRAIN_* "
        "variables of this environment, else the operator's defaults",
    )
    plan = commands.add_parser(
        "plan", help="print each job's GPU memory per GPU; exit 0 when it fits, 1 when it does not, 2 on a bad job"
    )
    plan.add_argument("file", help="job manifest (YAML, one or more documents; - reads stdin)")
    plan.add_argument("--config", help="the model's config.json, where the job's model source is not on this machine")
    plan.add_argument("--nodes", help="`kubectl get nodes -o json` (or yaml): the GPU memory from their labels")
    plan.add_argument("--gpu", metavar="MODEL", help=f"plan for this AMD Instinct model: {', '.join(INSTINCT_GIB)}")
    plan.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    commands.add_parser("crd", help="print the RocmTrainingJob CustomResourceDefinition")
    for name, command in sorted(plugins.items()):
        commands.add_parser(name, help=(command.__doc__ or "").strip().splitlines()[0], add_help=False)
    return parser


# Error lines printed at most: a document with thousands of unknown keys is still one screen.
MAX_REPORTED = 50


def _report(lines: list[str]) -> int:
    for line in lines[:MAX_REPORTED]:
        print(line, file=sys.stderr)
    if len(lines) > MAX_REPORTED:
        print(f"... and {len(lines) - MAX_REPORTED} more errors", file=sys.stderr)
    return EXIT_INVALID


def cmd_render(args: argparse.Namespace) -> int:
    """Print one RayJob per job, as a multi-document YAML stream: what the operator applies, the address of its
    progress endpoint a placeholder (`rocmtrain.render.options.preview_options`)."""
    from rocmtrain.render import render_rayjob_yaml
    from rocmtrain.render.options import preview_options

    jobs, errors = read_jobs(args.file, "cluster")
    if errors:
        return _report(errors)
    options = preview_options()
    sys.stdout.write("---\n".join(render_rayjob_yaml(job, options=options) for job in jobs))
    return 0


def _settings_file(path: str) -> dict[str, str]:
    """The NAME=value lines of a file (`kubectl set env --list`); blank lines and `#` comments are skipped."""
    settings: dict[str, str] = {}
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.strip().isidentifier():
            raise ConfigError(f"line {number}: not NAME=value")
        settings[name.strip()] = value
    return settings


def _policy(path: str | None) -> tuple[Policy, str]:
    """The admission policy `validate` applies (the operator's), and what it is."""
    if path is not None:
        try:
            return policy_from_env(_settings_file(path)), f"the operator's settings in {path}"
        except (ConfigError, ManifestError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
    policy = policy_from_env(os.environ)
    if policy == Policy():
        return policy, "the operator's default limits; the cluster's admin may set others (see --policy)"
    return policy, "the operator's settings in this environment's ROCMTRAIN_* variables"


def cmd_validate(args: argparse.Namespace) -> int:
    """Report every error with its path, the admission policy's too for a cluster job; one OK line when there is
    none."""
    jobs, errors = read_jobs(args.file, args.context)
    if errors:
        return _report(errors)
    names = ", ".join(job.metadata.name for job in jobs)
    if args.context == "local":  # `rocmtrain run`: no operator, no policy
        print(f"{args.file}: OK ({names})")
        return 0
    try:
        policy, source = _policy(args.policy)
    except ConfigError as exc:  # the operator would not start with these settings either
        print(f"rocmtrain validate: the policy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    refused = [
        f"{args.file if len(jobs) == 1 else f'{args.file}: document {index}'}: {error}"
        for index, job in enumerate(jobs, start=1)
        for error in policy.check(policy.with_defaults(job).spec, job.metadata.namespace or "")
    ]
    if refused:
        return _report([*refused, f"{args.file}: refused by {source}"])
    print(f"{args.file}: OK ({names}) within {source}")
    return 0


def _read_nodes(path: str) -> Any:
    """The objects of a `kubectl get nodes` file (JSON or YAML); ValueError naming it and the problem in one line."""
    try:
        return yaml.safe_load(decode(Path(path).read_bytes()))
    except ManifestError as exc:
        problem = str(exc)
    except yaml.YAMLError as exc:
        problem = yaml_problem(exc)
    except RecursionError:
        problem = "nested too deep to be a list of nodes"
    except ValueError as exc:  # a value its tag cannot convert, such as an integer of more than 4,300 digits
        problem = f"invalid YAML: {exc}"
    raise ValueError(f"--nodes {path}: {problem}")


def _nodes_gpu_memory(path: str, job: RocmTrainingJob) -> GpuMemory | None:
    """The GPU memory the labels of the nodes in a `kubectl get nodes` file give the job."""
    from rocmtrain.admission.node_fit import gpu_memory, node_info

    found = _read_nodes(path)
    items = found.get("items", [found]) if isinstance(found, dict) else []
    nodes = [info for item in items if isinstance(item, dict) and (info := node_info(item)) is not None]
    return gpu_memory(job.spec, nodes)


def _gpu(args: argparse.Namespace, job: RocmTrainingJob) -> GpuMemory | None:
    """The memory of one of the job's GPUs: --gpu, else the nodes' labels, else the job's GPU selector."""
    if args.gpu is not None:
        if (named := table_gpu_memory(args.gpu)) is None:
            raise ValueError(f"--gpu {args.gpu}: not an AMD Instinct model the plan knows ({', '.join(INSTINCT_GIB)})")
        return named
    return (_nodes_gpu_memory(args.nodes, job) if args.nodes else None) or job_gpu_memory(job.spec)


def cmd_plan(args: argparse.Namespace) -> int:
    """Print each job's memory plan per GPU next to its GPUs' memory: 0 when all fit, 1 when one does not."""
    from rocmtrain.cli.model_files import ModelFileError, config_path, read_config
    from rocmtrain.plan.fit import plan_job
    from rocmtrain.plan.model_shapes import ModelConfigError
    from rocmtrain.views.plan_table import plan_json, plan_text

    jobs, errors = read_jobs(args.file, "local")
    if errors:
        _report(errors)
        return EXIT_USAGE
    job_dir = Path(args.file).parent if args.file != "-" else Path.cwd()
    shown: list[Any] = []
    fits = True
    for job in jobs:
        try:
            path = Path(args.config) if args.config else config_path(job.spec.model.source, job_dir)
            planned = plan_job(job.spec, read_config(path), _gpu(args, job))
        except (ModelFileError, ModelConfigError, ValueError) as exc:
            _report([f"{args.file}: {job.metadata.name}: {exc}"])
            return EXIT_USAGE
        fits = fits and planned.fits is not False
        shown.append(plan_json(job, planned) if args.output == "json" else plan_text(job, planned))
    if args.output == "json":
        print(json.dumps(shown[0] if len(shown) == 1 else shown, indent=2))
    else:
        sys.stdout.write("\n".join(shown))
    return 0 if fits else EXIT_DOES_NOT_FIT


def cmd_crd(_: argparse.Namespace) -> int:
    """Print the CRD exactly as committed under crds/."""
    from rocmtrain.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


BUILT_IN = {"render": cmd_render, "validate": cmd_validate, "plan": cmd_plan, "crd": cmd_crd}


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
