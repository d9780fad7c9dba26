"""The project's exceptions, under one root (as httpx's are): catch a family, or everything of ours at once.

    RocmTrainError
    ├── ConfigError  a setting or a job that cannot be used as configured (also a ValueError)
    ├── InputError   input refused: a request, a report, a file that is not valid or not allowed
    ├── Conflict     an object is not as the write expects: it changed since it was read (HTTP 409),
    │                or its name is taken
    ├── NotFound     what was asked about does not exist
    └── ApiError     the API server (or another service) refused a call or did not answer

Each module's own exceptions derive from one of the families (the progress endpoint's
`Refusal`s also carry their HTTP answer). The standard library only: the training image
imports this too.
"""

from __future__ import annotations


class RocmTrainError(Exception):
    """Any error of the operator, its CLI or the training image."""


class ConfigError(RocmTrainError, ValueError):
    """A setting (an environment variable, a job, a model or data set it names) that cannot be used as configured;
    the message names it, never a secret value."""


class InputError(RocmTrainError):
    """Input refused: a request, a report body or a file that is not valid or not allowed."""


class Conflict(RocmTrainError):
    """An object is not as the write expects: it changed since it was read (a resourceVersion precondition
    failed, HTTP 409), or its name is taken by an object that is not ours."""


class NotFound(RocmTrainError):
    """What was asked about does not exist."""


class ApiError(RocmTrainError):
    """The API server (or another service) refused a call or did not answer."""
