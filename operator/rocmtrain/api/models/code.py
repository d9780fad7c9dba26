"""spec.code: your own training code, run instead of the built-in loop."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.contract import PYTHON
from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.types import AbsPath, PythonModule, Text

# Arguments of spec.code: at most this many, and this many characters in all (joined by spaces), so that
# the quoted command line stays far below Linux's 128 KiB limit on one argument: KubeRay's submitter runs
# `ray job submit -- <entrypoint>` as one `bash -c` argument.
MAX_CODE_ARGS = 256
MAX_CODE_CHARS = 16384
CODE_ONE_OF = "set exactly one of command or module"
ARGS_NEED_MODULE = "args go with module; with command, the arguments are part of command"
PROGRAM_EMPTY = "the program, command[0], must not be empty"
COMMAND_TOO_LONG = f"command holds at most {MAX_CODE_CHARS} characters in all"
ARGS_TOO_LONG = f"args hold at most {MAX_CODE_CHARS} characters in all"


def _joined_length(arguments: list[str] | None) -> int:
    """The characters of `arguments` joined by spaces (CEL's `size(list.join(' '))`)."""
    return len(" ".join(arguments or []))


class CodeSpec(ApiModel):
    """Your own training code, run instead of the built-in loop: a command in spec.image on the Ray head,
    where Ray's job API runs it as the Ray job's driver (see docs/guides/own-code.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("has(self.command) != has(self.module)", CODE_ONE_OF),
                _cel("!has(self.args) || has(self.module)", ARGS_NEED_MODULE, fieldPath=".args"),
                _cel("!has(self.command) || size(self.command[0]) > 0", PROGRAM_EMPTY, fieldPath=".command"),
                _cel(
                    f"!has(self.command) || size(self.command.join(' ')) <= {MAX_CODE_CHARS}",
                    COMMAND_TOO_LONG,
                    fieldPath=".command",
                ),
                _cel(
                    f"!has(self.args) || size(self.args.join(' ')) <= {MAX_CODE_CHARS}",
                    ARGS_TOO_LONG,
                    fieldPath=".args",
                ),
            ]
        }
    )

    command: list[Text] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CODE_ARGS,
        description=(
            f"The command line as a list: the program, then its arguments (at most {MAX_CODE_ARGS}, "
            f"{MAX_CODE_CHARS} characters in all), for example [python, /code/train.py, --epochs, '3']. "
            "Every argument is passed as it is written, quoted: no shell interprets it."
        ),
    )
    module: PythonModule | None = Field(
        default=None, description=f"A Python module to run as `{PYTHON} -m <module> <args>`, instead of command."
    )
    args: list[Text] | None = Field(
        default=None,
        max_length=MAX_CODE_ARGS,
        description=f"The arguments of module (at most {MAX_CODE_ARGS}, {MAX_CODE_CHARS} characters in all).",
    )
    working_dir: AbsPath | None = Field(
        default=None,
        description=(
            "The folder the command runs in (in the image or on a volume); Ray's job folder on a cluster and "
            "the job file's folder with `rocmtrain run` when unset."
        ),
    )

    @model_validator(mode="after")
    def _one_command(self) -> CodeSpec:
        if (self.command is None) == (self.module is None):
            raise ValueError(CODE_ONE_OF)
        if self.args is not None and self.module is None:
            raise ValueError(ARGS_NEED_MODULE)
        if self.command is not None and not self.command[0]:
            raise ValueError(PROGRAM_EMPTY)
        if _joined_length(self.command) > MAX_CODE_CHARS:
            raise ValueError(COMMAND_TOO_LONG)
        if _joined_length(self.args) > MAX_CODE_CHARS:
            raise ValueError(ARGS_TOO_LONG)
        return self

    def argv(self) -> list[str]:
        """The command line: `command`, or the interpreter running `module` with `args`."""
        if self.command is not None:
            return list(self.command)
        return [PYTHON, "-m", str(self.module), *(self.args or [])]
