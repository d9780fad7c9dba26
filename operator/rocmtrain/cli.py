"""The `rocmtrain` command: render, validate and run jobs, print the CRD.

Heavy imports (torch, ray) happen only inside `rocmtrain run`.
"""

from __future__ import annotations

import argparse
import sys

from rocmtrain.api.manifests import read_jobs

EXIT_INVALID = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
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
    commands.add_parser("run", help="train a job locally on Ray (`rocmtrain run --help`)", add_help=False)
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rocmtrain` console script."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:
        from rocmtrain_train.local import main as run_main

        return run_main(args[1:])
    parsed = _parser().parse_args(args)
    handlers = {"render": cmd_render, "validate": cmd_validate, "crd": cmd_crd}
    try:
        return handlers[parsed.command](parsed)
    except OSError as exc:
        print(f"rocmtrain: {exc}", file=sys.stderr)
        return EXIT_USAGE
