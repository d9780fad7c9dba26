"""Reading job manifests: YAML documents resolved as kubectl resolves them, then validated.

`read_jobs` is what every command that reads a job file calls (`rocmtrain validate`,
`rocmtrain render`, `rocmtrain plan`, `rocmtrain run`), so they accept and refuse the same
files with the same messages.

Whatever the file holds, reading it ends in jobs or in one line per problem, never in a
traceback, and within bounds checked before any Python object is built: its size (the whole
file, then each document, before the YAML parse), the documents' nesting depth and number of
nodes (aliases counted at their full size, so an alias bomb stops early), and integers within
64 bits. Duplicate keys are refused, as kubectl refuses them. A UTF-8 or UTF-16 byte-order
mark is honoured, as kubectl honours it; any other text must be UTF-8.
"""

from __future__ import annotations

import codecs
import itertools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner, ScannerError

from rocmtrain.api.errors import InputError
from rocmtrain.api.job_config import JOB_CONFIG_LIMIT
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import Context, validate_job

# A job the operator takes is at most JOB_CONFIG_LIMIT (96 KiB) as compact JSON; as YAML, with its
# metadata's annotations at the API server's cap (256 KiB), indentation and comments, far less than this.
DOCUMENT_LIMIT: Final = 1 << 20
FILE_LIMIT: Final = 16 * DOCUMENT_LIMIT
MAX_DOCUMENTS: Final = 1000
# A job is some 12 levels deep and, within JOB_CONFIG_LIMIT, under 50,000 nodes; these leave room.
MAX_DEPTH: Final = 64
MAX_NODES: Final = 100_000
# Kubernetes' integers are 64-bit; a longer spelling is refused before it is converted.
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 63) - 1
_MAX_INT_CHARS: Final = 100
# Where PyYAML (and libyaml) end a document: `---` or `...` at the start of a line, then a blank or the end.
_DOCUMENT_MARKER = re.compile(r"^(?:---|\.\.\.)(?=[ \t\r\n]|\Z)", re.MULTILINE)
_BOMS: Final = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_QUOTED: Final = 40  # characters of a key or a value that a message quotes
_LINE: Final = 240  # characters of a parser's message


class ManifestError(InputError):
    """A job file that cannot be read as YAML within the bounds: one line, without the file's name."""


def _short(text: str, limit: int = _QUOTED) -> str:
    """`text` on one line, at most `limit` characters of it."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else f"{flat[: limit - 1]}… ({len(flat):,} characters)"


def decode(data: bytes) -> str:
    """The text of a job file's bytes: UTF-8, or UTF-8 or UTF-16 after a byte-order mark."""
    bom, encoding = next(((bom, name) for bom, name in _BOMS if data.startswith(bom)), (b"", "utf-8"))
    try:
        return data[len(bom) :].decode(encoding)
    except UnicodeDecodeError as exc:
        offset = len(bom) + exc.start
        line = data.count(b"\n", 0, offset) + 1
        raise ManifestError(
            f"not {encoding.upper()} text: byte {data[offset]:#04x} on line {line} (offset {offset:,}); "
            "save the file as UTF-8"
        ) from None


def read_text(file: str) -> str:
    """The text of a job file (`-` reads stdin), read no further than FILE_LIMIT.

    Raises OSError when it cannot be read, ManifestError when it is too large or not text.
    """
    if file == "-":
        data = sys.stdin.buffer.read(FILE_LIMIT + 1)
    else:
        with Path(file).open("rb") as stream:
            data = stream.read(FILE_LIMIT + 1)
    if len(data) > FILE_LIMIT:
        raise ManifestError(f"larger than {FILE_LIMIT:,} bytes, far more than any job file")
    return decode(data)


def check_size(text: str) -> None:
    """Refuse a text of too many documents, or with a document over DOCUMENT_LIMIT, before the YAML parse."""
    markers = [m.start() for m in itertools.islice(_DOCUMENT_MARKER.finditer(text), MAX_DOCUMENTS + 1)]
    if len(markers) > MAX_DOCUMENTS:
        raise ManifestError(f"more than {MAX_DOCUMENTS:,} YAML documents in one file")
    for start, end in itertools.pairwise([0, *markers, len(text)]):
        size = len(text[start:end].encode())
        if size > DOCUMENT_LIMIT:
            where = f"the document at line {text.count(chr(10), 0, start) + 1}" if markers else "the document"
            raise ManifestError(
                f"{where} is {size:,} bytes, over the limit of {DOCUMENT_LIMIT:,}: a job is at most "
                f"{JOB_CONFIG_LIMIT:,} bytes as JSON (the operator's limit)"
            )


class _BoundedComposer(Composer):
    """Composes each document within MAX_DEPTH levels and MAX_NODES nodes, an alias counted as the nodes it
    stands for; an alias inside the node it names is refused."""

    peek_event: Callable[[], Any]  # the parser's, beside this class in each loader
    anchors: dict[Any, Node]

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[int, int] = {}  # id of each node composed so far -> nodes it stands for

    def compose_document(self) -> Node | None:
        self._nodes, self._sizes = 0, {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            named = self.anchors.get(event.anchor)  # an unknown one is the composer's own error
            if named is not None:
                if id(named) not in self._sizes:
                    mark: Any = event.start_mark  # PyYAML's Mark, or libyaml's
                    raise ComposerError(None, None, f"the alias *{_short(event.anchor or '')} is inside its node", mark)
                self._count(self._sizes[id(named)], event)
            return super().compose_node(parent, index)
        if self._depth == MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        self._count(1, event)
        before = self._nodes
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = self._nodes - before + 1
        return node

    def _count(self, nodes: int, event: Any) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise ComposerError(None, None, f"more than {MAX_NODES:,} nodes, aliases counted in full", event.start_mark)


class _Constructor(SafeConstructor):
    """SafeConstructor that refuses duplicate keys, integers beyond 64 bits, and values its tag cannot convert."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            self._refuse_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicates(self, node: MappingNode) -> None:
        """kubectl's reader (sigs.k8s.io/yaml, strict) refuses a key set twice in one mapping; merged keys (`<<`)
        may be set again."""
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.get(key)
            except TypeError:  # an unhashable key: the constructor's own error
                continue
            if line is not None:  # equal keys (`1` and `0x1`, `1` and `true`) would be one key of the mapping
                problem = f"duplicate key {_short(repr(key))} (first on line {line})"
                raise ConstructorError(None, None, problem, key_node.start_mark)
            first[key] = key_node.start_mark.line + 1

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = self.construct_scalar(node)
        number = SafeConstructor.construct_yaml_int(self, node) if len(text) <= _MAX_INT_CHARS else None
        if number is None or not _INT_MIN <= number <= _INT_MAX:
            raise ConstructorError(None, None, f"the integer {_short(text)} is beyond 64 bits", node.start_mark)
        return number


def _checked(construct: Callable[[Any, Any], Any], what: str) -> Callable[[Any, Any], Any]:
    """A scalar's constructor that refuses a value it cannot convert (`!!int abc`, `2024-02-30`) in one line."""

    def run(self: Any, node: Any) -> Any:
        try:
            return construct(self, node)
        except (ValueError, LookupError, AttributeError, OverflowError) as exc:
            problem = f"{_short(str(node.value))} is not {what}: {_short(str(exc), _LINE)}"
            raise ConstructorError(None, None, problem, node.start_mark) from None

    return run


_Constructor.yaml_constructors = {
    **SafeConstructor.yaml_constructors,
    "tag:yaml.org,2002:int": _checked(_Constructor.construct_yaml_int, "an integer"),
    "tag:yaml.org,2002:float": _checked(SafeConstructor.construct_yaml_float, "a number"),
    "tag:yaml.org,2002:bool": _checked(SafeConstructor.construct_yaml_bool, "true or false"),
    "tag:yaml.org,2002:timestamp": _checked(SafeConstructor.construct_yaml_timestamp, "a date"),
}


class _Resolver(Resolver):
    """Resolver that also reads `1e-4` as a number (PyYAML needs a dot; kubectl does not)."""


_Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


class PureLoader(Reader, Scanner, Parser, _BoundedComposer, _Constructor, _Resolver):
    """The bounded loader with PyYAML's own scanner and parser."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        """Stops at a `[` or `{` past MAX_DEPTH as it is scanned: the scanner looks up to 1,024 characters ahead
        for a simple key, at a cost that grows with the square of the flow levels open (libyaml stops at 1,000)."""
        if self.flow_level >= MAX_DEPTH:
            raise ScannerError(None, None, f"nested more than {MAX_DEPTH} levels deep", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


try:
    from yaml._yaml import CParser
except ImportError:  # a PyYAML built without libyaml
    LOADER: type = PureLoader
else:

    class FastLoader(_BoundedComposer, CParser, _Constructor, _Resolver):
        """The bounded loader with libyaml's scanner and parser, several times faster; the composer stays
        the bounded one."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)

    LOADER = FastLoader


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where, then what."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f" ({_short(exc.context, _LINE)})" if exc.context else ""
        problem = _short(exc.problem or "", _LINE)
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}{context}"
    if isinstance(exc, ReaderError) and isinstance(exc.character, int):
        return f"invalid YAML: the character U+{exc.character:04X} at offset {exc.position:,}: {_short(exc.reason)}"
    return f"invalid YAML: {_short(str(exc), _LINE)}"


def parse(text: str) -> list[Any]:
    """Every non-empty document of a (multi-document) YAML text, within the bounds; ManifestError else."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=LOADER) if doc is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(yaml_problem(exc)) from None


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of a (multi-document) YAML text, its size checked before it is parsed."""
    check_size(text)
    return parse(text)


def read_jobs(file: str, context: Context) -> tuple[list[RocmTrainingJob], list[str]]:
    """The valid jobs of a manifest file (`-` reads stdin), and one line per problem found in it.

    Each line names the file (and the document, when there are several) and the field; a file
    that cannot be read as YAML is one line. An unreadable file raises OSError.
    """
    try:
        documents = load_documents(read_text(file))
    except ManifestError as exc:
        return [], [f"{file}: {exc}"]
    if not documents:
        return [], [f"{file}: no job in the file"]
    jobs: list[RocmTrainingJob] = []
    lines: list[str] = []
    for index, document in enumerate(documents, start=1):
        job, errors = validate_job(document, context=context)
        where = file if len(documents) == 1 else f"{file}: document {index}"
        lines += [f"{where}: {error}" for error in errors]
        if job is not None:
            jobs.append(job)
    return jobs, lines
