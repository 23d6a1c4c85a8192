"""The ``graphsurgeon`` command: ``demo``, ``modules``, ``render`` and ``report``.

Exit codes: 0 success, 1 the command ran and found a problem (a mismatch), 2 bad usage, an
unreadable program file, one that needs ``--trust-file`` (a .pt2 is code: see ``_TRUST_NOTE``)
or an output that cannot be written; errors are one line on standard error, without a
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import logging
import math
import os
import pickle
import re
import stat
import statistics
import sys
import time
import warnings
import zipfile
import zlib
from pathlib import Path

from .errors import GraphSurgeonError

__all__ = ["main"]


# -- reading a program file ---------------------------------------------------------------------

# A .pt2 is code. torch.export.load unpickles what the file holds (its example inputs, weights
# that are tensor subclasses, opaque constants) and retries a weights-only unpickling that fails
# with a full one, which calls whatever the pickle names; it also loads the compiled AOTInductor
# libraries a package may hold. Unless told to trust the file, the commands load it with every
# unpickling restricted to tensors and plain values, and refuse what needs more.
_TRUST_NOTE = """\
A .pt2 file is code: torch.export.load unpickles what it holds, and a pickle can run any
Python. graphsurgeon loads it weights-only (tensors and plain values) and refuses a file that
needs more (pickled Python objects, compiled AOTInductor code) with exit status 2, unless
given --trust-file: only for a file you trust as you would a program.
"""

_TRUST_HELP = (
    "load the .pt2 as torch.export.load does, running any pickled Python or compiled code it "
    "holds: only for a file you trust as you would a program"
)

_TRUST_HINT = "pass --trust-file only if you trust the file as you would a program"

# What the folders of a .pt2 hold, for the messages (names as torch's archive reader gives them).
_ARCHIVE_ROLES = {
    "data/sample_inputs/": "its example inputs",
    "data/weights/": "a weight",
    "data/constants/": "a constant",
}

# The largest entry read to say what its pickle calls.
_SCANNED_AT_MOST = 64 << 20


class _PickleRefused(Exception):
    """A plain pickle.load(s) reached while loading an untrusted file: refused before it ran."""


@contextlib.contextmanager
def _weights_only(refused: list):
    """Every unpickling in the block is weights-only.

    torch.load as with ``weights_only=True``: torch's own switch, which also overrides the
    ``weights_only=False`` of the retry. A plain ``pickle.load(s)`` (torch unpickles opaque
    constants with it) is refused before it reads a byte; ``refused`` gets the bytes.
    """
    names = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    saved_environment = {name: os.environ.get(name) for name in names}
    saved_pickle = pickle.load, pickle.loads

    def refuse(data, *args, **kwargs):
        refused.append(data if isinstance(data, (bytes, bytearray)) else None)
        raise _PickleRefused("a plain pickle")

    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # both set is an error of torch's
    pickle.load = pickle.loads = refuse
    try:
        yield
    finally:
        pickle.load, pickle.loads = saved_pickle
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Keep(logging.Handler):
    """A log handler that keeps the records, to be read instead of printed."""

    def __init__(self, records: list):
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _torch_logs_kept(records: list):
    """torch logs what goes wrong while loading, whole tracebacks included, and then raises an
    error that says "check the warnings above": the records are kept here instead of printed,
    and the one-line error names the cause they hold (and its Python warnings likewise)."""
    keep = _Keep(records)
    loggers = [
        logger
        for name, logger in sorted(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch."))
    ]
    saved = [(logger, logger.handlers, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers = [keep]
        logger.propagate = False
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate


def _compiled_code(path: Path) -> str | None:
    """The first entry of compiled AOTInductor code in the archive (torch.export.load loads
    it as a shared library), or None."""
    from torch.export.pt2_archive import PT2ArchiveReader
    from torch.export.pt2_archive.constants import AOTINDUCTOR_DIR

    try:
        with PT2ArchiveReader(str(path)) as reader:
            names = reader.get_file_names()
    except Exception:  # not a .pt2 archive: torch's loader stops at the same place
        return None
    return next((name for name in sorted(names) if name.startswith(AOTINDUCTOR_DIR)), None)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling, each once."""
    chain: list[BaseException] = []
    while error is not None and not any(error is seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _weights_only_refusal(error: BaseException) -> bool:
    return isinstance(error, pickle.UnpicklingError) and str(error).startswith(
        "Weights only load failed"
    )


def _entries(archive: zipfile.ZipFile) -> list[tuple[str, zipfile.ZipInfo]]:
    """(the name torch reads it by, without the archive's top folder; the entry) of each entry."""
    return [(info.filename.partition("/")[2] or info.filename, info) for info in archive.infolist()]


def _in_words(name: str) -> str:
    """An entry's name, and what it holds when its folder says (``data/weights/w``: a weight)."""
    role = next((r for folder, r in _ARCHIVE_ROLES.items() if name.startswith(folder)), "")
    return f"{name} ({role})" if role else name


def _unsafe_globals(archive: zipfile.ZipFile) -> list[tuple[str, list[str]]]:
    """(entry, what its pickle calls beyond weights-only unpickling) of each torch.save pickle
    in the archive that calls anything more; read statically, nothing is unpickled."""
    import torch

    found = []
    for name, info in _entries(archive):
        if info.file_size > _SCANNED_AT_MOST:  # (for the message only: a bomb is not read)
            continue
        with archive.open(info) as entry:
            if entry.read(4) != b"PK\x03\x04":  # what torch.save writes is a zip archive
                continue
        try:
            calls = torch.serialization.get_unsafe_globals_in_checkpoint(
                io.BytesIO(archive.read(info))
            )
        except Exception:  # not a torch.save archive after all
            continue
        if calls:
            found.append((name, sorted(calls)))
    return found


def _holding(archive: zipfile.ZipFile, data) -> str | None:
    """The entry that holds exactly ``data`` (by size and CRC-32), or None."""
    if data is None:
        return None
    size_and_crc = (len(data), zlib.crc32(data))
    return next(
        (n for n, info in _entries(archive) if (info.file_size, info.CRC) == size_and_crc), None
    )


def _needs_trust(path: Path, causes: list[BaseException], refused: list) -> str | None:
    """What in the file needs more than weights-only unpickling, in words, or None."""
    refusal = next((c for c in causes if _weights_only_refusal(c)), None)
    if not refused and refusal is None:
        return None
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError):
        archive = None
    with archive or contextlib.nullcontext():
        if refused:
            entry = _holding(archive, refused[0]) if archive else None
            where = _in_words(entry) if entry else "an entry"
            return f"{where} is a pickled Python object, which torch unpickles without restriction"
        unsafe = _unsafe_globals(archive) if archive else []
    if unsafe:
        name, calls = unsafe[0]
        return f"{_in_words(name)} is a pickle that calls {', '.join(calls)}"
    detail = next(
        (
            line.strip()
            for line in str(refusal).splitlines()
            if line.strip().startswith("WeightsUnpickler error:")
        ),
        "",
    )
    return "a pickle in it needs more than weights-only unpickling" + (
        f" ({detail})" if detail else ""
    )


def _refuse_untrusted(path: Path, what: str) -> SystemExit:
    return SystemExit(
        _fail(f"{path}: {what}: unpickling it could run code from the file; {_TRUST_HINT}")
    )


def _load_failure(error: BaseException, logged: list[BaseException]) -> str:
    """The cause of a failed load, in one short line of text."""
    if "warnings above" in str(error):  # torch points at what it logged: name that instead
        if not logged:
            return "torch found no exported program in it"
        error = logged[0]
    return _shortened(_first_line(error))


def _shortened(text: str, limit: int = 200) -> str:
    """``text`` cut after its last sentence that ends within ``limit`` characters, or at the
    limit (a hostile file's names and values are in torch's messages, at any length).

    >>> _shortened("RuntimeError: the file is not found. This is an internal error. Or", 60)
    'RuntimeError: the file is not found.'
    >>> _shortened("x" * 300, 10)
    'xxxxxxxxxx…'
    """
    if len(text) <= limit:
        return text
    end = text.rfind(". ", 0, limit)
    return text[: end + 1] if end > limit // 2 else text[:limit] + "…"


# -- the types a program's specs name ----------------------------------------------------------

# A program stores the structure of its inputs and outputs, and of each preserved module call,
# as pytree specs that name their container types by torch's serialized type names
# ("transformers.modeling_outputs.Seq2SeqLMOutput"). torch reads a spec only when that type is
# registered with its pytree, which importing the module that defines it does: in a notebook,
# the model's own imports did. A file is not trusted to choose what is imported: the commands
# import on their own only the modules of this fixed list, whose import registers the output
# types and runs nothing a file can choose; any other module only when given with --import.
_KNOWN_TYPE_MODULES = ("transformers.modeling_outputs",)

_IMPORT_HELP = (
    "import the Python module MODULE first (from the current directory, then sys.path), for a "
    "program whose specs name a type it registers with torch's pytree (repeat for more)"
)

# torch's error for a spec that names a type it does not know (the serialized type name).
_UNREGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered")


def _import_requested(modules: list[str]) -> None:
    """Import the modules given with ``--import``: the user's consent to run them."""
    for module_name in modules:
        _import_from_here(f"--import {module_name}", module_name)


def _spec_types(path: Path) -> dict[str, str]:
    """{serialized type name: where the program first names it, as the start of a sentence
    ("its output is a", "the input of its module 'encoder' holds a")} of the types its specs
    name, read from the archive's JSON (nothing is unpickled); empty when that cannot be read
    (torch's load then says what is wrong)."""
    import json

    from torch.export.pt2_archive.constants import MODELS_DIR

    found: dict[str, str] = {}

    def types_of(spec, subject: str, outermost: bool) -> None:
        if isinstance(spec, list):
            for item in spec:
                types_of(item, subject, outermost)
        elif isinstance(spec, dict):
            if isinstance(spec.get("type"), str):
                found.setdefault(spec["type"], f"{subject} {'is' if outermost else 'holds'} a")
            types_of(spec.get("children_spec"), subject, False)

    def walk(value, fqn: str) -> None:
        if isinstance(value, list):
            for item in value:
                walk(item, fqn)
        elif isinstance(value, dict):
            fqn = value["fqn"] if isinstance(value.get("fqn"), str) else fqn
            for key, item in value.items():
                if key in ("in_spec", "out_spec") and isinstance(item, str):
                    side = "input" if key == "in_spec" else "output"
                    subject = f"the {side} of its module {_shown(fqn)}" if fqn else f"its {side}"
                    # a spec is [protocol, outermost node]
                    types_of(json.loads(item)[1:], subject, True)
                else:
                    walk(item, fqn)

    try:
        with zipfile.ZipFile(path) as archive:
            for name, info in _entries(archive):
                if name.startswith(MODELS_DIR) and name.endswith(".json"):
                    walk(json.loads(archive.read(info)), "")
    except Exception:  # the scan only helps: torch's load reads the file and says what is wrong
        return {}
    return found


def _shown(name: str) -> str:
    """A name from the file as the message shows it: a Python name as it is, anything else
    quoted and shortened (a hostile file's names may hold line breaks, at any length)."""
    return name if re.fullmatch(r"[\w.]{1,200}", name) else _shortened(repr(name))


def _module_of(type_name: str) -> str:
    """The module a serialized type name names (torch writes ``module.Class`` by default)."""
    return type_name.rpartition(".")[0] or type_name


def _unregistered_type(path: Path, type_name: str, where: str, imported: set[str]) -> str:
    """The one line for a type torch must know to read the program and does not; ``where``
    starts the sentence (see _spec_types)."""
    module_name = _module_of(type_name)
    if module_name in imported:
        return (
            f"{path}: {where} {_shown(type_name)}, which importing {module_name} did not "
            "register with torch's pytree; pass --import with the module that registers it, as "
            "the code that saved the program did"
        )
    return (
        f"{path}: {where} {_shown(type_name)}, a type torch must know to read the file; pass "
        f"--import {_shown(module_name)} if you trust that module (graphsurgeon imports on its "
        f"own only {', '.join(_KNOWN_TYPE_MODULES)}, never a module a file names)"
    )


def _register_spec_types(path: Path, imports: list[str]) -> None:
    """Make torch able to read the types the program's specs name: the modules given with
    ``--import``, then the known modules of the types still missing, are imported; exit 2
    with one line naming a type that is still missing, and the flag that brings it."""
    import torch.utils._pytree as pytree

    _import_requested(imports)
    registered = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    missing = {name: where for name, where in _spec_types(path).items() if name not in registered}
    imported = set(imports)
    for module_name in sorted({_module_of(name) for name in missing}):
        if module_name not in _KNOWN_TYPE_MODULES:
            continue
        try:
            with warnings.catch_warnings():  # what the module warns of is not the user's concern
                warnings.simplefilter("ignore")
                importlib.import_module(module_name)
        except Exception as error:
            name = next(n for n in missing if _module_of(n) == module_name)
            package = module_name.partition(".")[0]
            if isinstance(error, ModuleNotFoundError) and error.name == package:
                remedy = f"{package} is not installed: pip install {package}"
            else:
                remedy = f"importing {module_name} failed: {_first_line(error)}"
            raise SystemExit(_fail(f"{path}: {missing[name]} {_shown(name)}; {remedy}")) from None
        imported.add(module_name)
    still = [name for name in missing if name not in registered]
    if still:
        more = f" (and {len(still) - 1} more types)" if len(still) > 1 else ""
        first = still[0]
        raise SystemExit(_fail(_unregistered_type(path, first, missing[first], imported) + more))


def _load_program(path_text: str, *, trust: bool = False, imports: list[str] = ()):
    """The ExportedProgram in the file ``path_text``; exit 2 with one line when it cannot be
    read, or, unless ``trust``, when reading it could run code from it. The modules
    ``imports`` are imported first, and the known modules of the types its specs name (see
    ``_KNOWN_TYPE_MODULES``)."""
    import torch

    path = Path(path_text)
    try:
        mode = path.stat().st_mode  # through links: what a link names is what would be read
    except FileNotFoundError:
        raise SystemExit(_fail(f"{path}: no such file")) from None
    except OSError as error:  # a name too long, a loop of links: the path cannot be looked at
        raise SystemExit(_fail(f"{path}: cannot read ({error.strerror or error})")) from None
    if stat.S_ISDIR(mode):
        raise SystemExit(_fail(f"{path}: is a directory, expected a .pt2 file"))
    if not stat.S_ISREG(mode):
        # opening a named pipe waits for a writer, forever; a device such as /dev/zero never ends
        raise SystemExit(
            _fail(
                f"{path}: is {_file_kind(mode)}, not a regular file; expected a .pt2 file saved "
                "with torch.export.save"
            )
        )
    if path.suffix != ".pt2":
        raise SystemExit(
            _fail(
                f"{path}: expected a .pt2 file saved with torch.export.save, got {path.suffix or 'no suffix'!r}"
            )
        )
    if not trust:
        compiled = _compiled_code(path)
        if compiled is not None:
            raise SystemExit(
                _fail(
                    f"{path}: {compiled} is compiled AOTInductor code, which torch.export.load "
                    f"loads as a shared library and so runs; {_TRUST_HINT}"
                )
            )
    _register_spec_types(path, list(imports))
    records: list = []
    refused: list = []
    restricted = contextlib.nullcontext() if trust else _weights_only(refused)
    try:
        with _torch_logs_kept(records), restricted:
            program = torch.export.load(str(path))
    except Exception as error:
        logged = [r.exc_info[1] for r in records if r.exc_info and r.exc_info[1] is not None]
        causes = [cause for e in (error, *logged) for cause in _chain(e)]
        unsafe = None if trust else _needs_trust(path, causes, refused)
        if unsafe is not None:
            raise _refuse_untrusted(path, unsafe) from None
        unknown = next((m for c in causes if (m := _UNREGISTERED.search(str(c))) is not None), None)
        if unknown is not None:  # a spec the scan above could not read: the same line
            message = _unregistered_type(path, unknown.group(1), "it names", set(imports))
            raise SystemExit(_fail(message)) from None
        raise SystemExit(
            _fail(f"{path}: not a readable torch.export program ({_load_failure(error, logged)})")
        ) from None
    if refused:  # torch went on without what it could not unpickle: the program is not whole
        raise _refuse_untrusted(path, _needs_trust(path, [], refused))
    return program


def _file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words, from its ``st_mode``."""
    kinds = (
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((kind for test, kind in kinds if test(mode)), "a special file")


def _fail(message: str) -> int:
    print(f"graphsurgeon: error: {message}", file=sys.stderr)
    return 2


class _OutputFailed(Exception):
    """Standard output cannot be written (a full disk, a closed file): reported by main."""

    def __init__(self, error: OSError):
        super().__init__(error)
        self.error = error


def _out(text: str = "", end: str = "\n") -> None:
    """print() for a command's output: a write that fails is reported once, by main."""
    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()  # a full disk shows at the flush: here, not at interpreter exit
    except BrokenPipeError:
        raise  # the reader went away (| head): main ends quietly
    except OSError as error:
        raise _OutputFailed(error) from None


def _silence_stdout() -> None:
    # What could not be written stays in the buffer, and the interpreter would try (and fail,
    # loudly) to flush it at exit: point the real standard output at the null device.
    if sys.stdout is not sys.__stdout__:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def _cmd_modules(options) -> int:
    import graphsurgeon as gs

    ep = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    _out(gs.module_tree(ep).table())
    return 0


def _check_output(output: str, suffixes, program: str) -> None:
    """Exit 2 with one line unless a command that reads ``program`` may write ``output``: not
    the program file itself (by any path to it: a link, another spelling), and named with one
    of ``suffixes`` (checked without regard to case)."""
    try:
        same = Path(output).exists() and os.path.samefile(output, program)
    except (OSError, ValueError):  # the program is missing or unreadable: its load says so
        same = False
    if same:
        alias = "" if os.path.abspath(output) == os.path.abspath(program) else ", by another path"
        raise SystemExit(
            _fail(
                f"{output}: is the program file {program} itself{alias}; writing it would "
                "overwrite the program: choose another output file"
            )
        )
    suffix = Path(output).suffix.lower()
    if suffix not in suffixes:
        known = ", ".join(sorted(suffixes))
        raise SystemExit(
            _fail(
                f"{output}: unknown output format {suffix or '(no suffix)'!r}; use {known} "
                "(or - for standard output)"
            )
        )


# Output formats of ``render``, by file suffix: DOT text, or a layout by graphviz's dot.
_RENDER_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}

# What ``report -o`` writes: one HTML file.
_REPORT_SUFFIXES = (".html",)


def _parse_collapse(text: str):
    """``auto`` | ``none`` | a depth | comma-separated module names."""
    if text == "auto":
        return "auto"
    if text == "none":
        return None
    if re.fullmatch(r"[0-9]+", text):  # str.isdigit() also takes '²', which int() refuses
        return int(text)
    return {name.strip() for name in text.split(",") if name.strip()}


def _cmd_render(options) -> int:
    from graphsurgeon import render

    output = options.output
    to_stdout = output is None or output == "-"
    if not to_stdout:
        _check_output(output, _RENDER_FORMATS, options.program)
    format_ = "dot" if to_stdout else _RENDER_FORMATS[Path(output).suffix.lower()]
    ep = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    highlight = [n.strip() for value in options.highlight for n in value.split(",") if n.strip()]
    try:
        view = render.graph_view(
            ep,
            highlight=highlight,
            collapse=_parse_collapse(options.collapse),
            max_nodes=options.max_nodes,
            show_parameters=options.show_parameters,
        )
        data = view.dot.encode() if format_ == "dot" else view.laid_out(format_)
    except GraphSurgeonError as error:
        return _fail(str(error))
    if to_stdout:
        _out(data.decode(), end="")
        return 0
    try:
        Path(output).write_bytes(data)
    except OSError as error:
        return _fail(f"{output}: cannot write ({error.strerror or error})")
    collapsed = f", {len(view.collapsed)} modules collapsed" if view.collapsed else ""
    print(
        f"{output}: {view.drawn_nodes} nodes drawn of {view.graph_nodes} in the program{collapsed}",
        file=sys.stderr,
    )
    return 0


_SWAP_FORM = "NAME=MODULE:ATTR, as in --swap layers.1.attn=my_kernels:FusedAttention"

_SWAP_HELP = """\
Each --swap NAME=MODULE:ATTR replaces the module NAME of the program (a name that
`graphsurgeon modules` lists; NAME@K for its call K alone) by the attribute ATTR of the
Python module MODULE, imported as `python -m` would: from the current directory first, then
sys.path (PYTHONPATH). ATTR may be dotted (Outer.attr). What it is decides what is swapped in:

  an nn.Module instance      used as it is;
  a class or a function      called with no arguments, or, when it takes one, with the
                             program's original module NAME, rebuilt from the program: a plain
                             nn.Module holding copies of its parameters and buffers under their
                             names (original.q.weight), that runs as the program ran it. It and
                             its submodules are not of the model's classes: a program keeps no
                             other attribute (no n_heads, config, in_features, methods). For
                             those, write a function that builds the real module and loads
                             the program's weights into it:
                               def build(original):
                                   real = T5Attention(config)
                                   real.load_state_dict(original.state_dict())
                                   return MyAttention(real)

The swapped program is then checked against the original program on the example inputs the
.pt2 keeps (torch.export.save stores them; without them, inputs are made from the input
shapes): verify (the outputs) and compare (each replacement against the nodes it replaced).
Without --swap the report shows the program alone: module tree, picture, export notes.

Exit status: 0 written and every check matches, 1 written and a check found a mismatch (or a
replacement failed to run), 2 bad usage, an unreadable program (or one that needs
--trust-file, below), a --swap that cannot be loaded or swapped, or a report that cannot be
written (or would overwrite the program, or is not .html).
"""


def _parse_swap(spec: str) -> tuple[str, str, str]:
    """A ``--swap`` value as (name, Python module, attribute); exit 2 when it is not one.

    >>> _parse_swap("layers.1.attn=my_kernels:FusedAttention")
    ('layers.1.attn', 'my_kernels', 'FusedAttention')
    >>> _parse_swap("blocks.a=b=kernels:Outer.make")  # a ModuleDict key may hold "="
    ('blocks.a=b', 'kernels', 'Outer.make')
    """
    # at the last "=": MODULE:ATTR has none, a module name may (ModuleDict keys are any text)
    name, equals, target = spec.rpartition("=")
    name, target = name.strip(), target.strip()
    if not equals or not name:
        raise SystemExit(_fail(f"--swap {spec}: expected {_SWAP_FORM}"))
    module_name, colon, attribute = target.partition(":")
    module_name, attribute = module_name.strip(), attribute.strip()
    if not colon or not module_name or not attribute:
        given = f"{target!r} is not MODULE:ATTR" if target else "nothing after '='"
        raise SystemExit(_fail(f"--swap {spec}: {given}; expected {_SWAP_FORM}"))
    return name, module_name, attribute


def _import_from_here(option: str, module_name: str):
    """Import ``module_name`` with the current directory first on sys.path, as ``python -m``
    does (a console script's sys.path starts with its own folder instead); exit 2 with one
    line that starts with ``option`` (``--swap NAME=MODULE:ATTR``) when it cannot be."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise SystemExit(
                _fail(
                    f"{option}: no Python module {module_name!r} in the current directory "
                    "or on sys.path; run from the folder that holds it, or add that folder to "
                    "PYTHONPATH"
                )
            ) from None
        raise SystemExit(
            _fail(f"{option}: importing {module_name!r} failed: {_first_line(error)}")
        ) from None
    except Exception as error:  # its own code raised (a SyntaxError, an ImportError, ...)
        raise SystemExit(
            _fail(f"{option}: importing {module_name!r} failed: {_first_line(error)}")
        ) from None
    finally:
        sys.path[:] = saved


def _first_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _required_arguments(factory) -> int | None:
    """How many arguments ``factory`` needs (None: it needs keyword-only ones)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no readable signature (a builtin): call it bare
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.default is inspect.Parameter.empty]
    if any(p.kind == inspect.Parameter.KEYWORD_ONLY for p in required):
        return None
    return sum(1 for p in required if p.kind in positional)


def _replacement(spec: str, program, rebuilt: dict):
    """(the name, the module ``--swap spec`` names, made as _SWAP_HELP says, and
    ``MODULE:ATTR``)."""
    import torch

    from graphsurgeon.errors import did_you_mean

    name, module_name, attribute = _parse_swap(spec)
    value = _import_from_here(f"--swap {spec}", module_name)
    where = module_name
    for part in attribute.split("."):
        if not hasattr(value, part):
            choices = [n for n in dir(value) if not n.startswith("_")]
            raise SystemExit(
                _fail(
                    f"--swap {spec}: {where} has no attribute {part!r}.{did_you_mean(part, choices)}"
                )
            )
        value, where = getattr(value, part), f"{where}.{part}"
    source = f"{module_name}:{attribute}"
    if isinstance(value, torch.nn.Module):
        return name, value, source
    if not callable(value):
        raise SystemExit(
            _fail(
                f"--swap {spec}: {source} is {_a(value)}; expected an nn.Module, or a class or "
                "function that returns one"
            )
        )
    needed = _required_arguments(value)
    if needed is None or needed > 1:
        raise SystemExit(
            _fail(
                f"--swap {spec}: {source} needs {'keyword' if needed is None else needed} "
                "arguments; --swap calls it with none, or with the original module: give it "
                "defaults, or write a function of no arguments that builds the replacement"
            )
        )
    call = f"{source}()" if needed == 0 else f"{source}(original)"
    try:
        made = value() if needed == 0 else value(_original_module(spec, program, name, rebuilt))
    except SystemExit:
        raise
    except AttributeError as error:
        rebuilt_as = getattr(type(error.obj), "_rebuilt_as", None)
        if rebuilt_as is None or not error.name or error.name.startswith("__"):
            # not an attribute a rebuilt module lacks (see _Rebuilt): said as it is
            raise SystemExit(_fail(f"--swap {spec}: {call} raised {_first_line(error)}")) from None
        missing = _missing_attribute(rebuilt_as, error.name, reader=call)
        raise SystemExit(_fail(f"--swap {spec}: {missing}")) from None
    except Exception as error:
        raise SystemExit(_fail(f"--swap {spec}: {call} raised {_first_line(error)}")) from None
    if not isinstance(made, torch.nn.Module):
        raise SystemExit(_fail(f"--swap {spec}: {call} returned {_a(made)}; expected an nn.Module"))
    return name, made, source


def _a(value) -> str:
    from graphsurgeon.errors import a_type

    return a_type(value)


@dataclasses.dataclass(frozen=True)
class _RebuiltAs:
    """What a module of an original that --swap passes is, for the message of an attribute it
    lacks."""

    fqn: str  # its name in the program
    type_name: str  # its type as the program recorded it ('' when it did not)
    path: str  # how the replacement's code reaches it: "original", "original.q"
    swapped_type: str  # the recorded type of the swapped module, the one to build for real
    swap: tuple[str, str, str] | None  # the --swap's (name, module, attribute); None: several


class _Rebuilt:
    """Mixed into the class of each module of an original that --swap passes: an attribute
    that the module rebuilt from the program does not have (the real module's ``n_heads``,
    ``config``, a method) raises an AttributeError that names it and says how to pass it,
    when the replacement is built and when it runs."""

    _rebuilt_as: _RebuiltAs

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") and name.endswith("__"):
                raise  # a protocol asked (copy, pickle): "no" is its answer, not an error
            message = _missing_attribute(type(self)._rebuilt_as, name)
            raise AttributeError(message, name=name, obj=self) from None


def _missing_attribute(rebuilt_as: _RebuiltAs, name: str, reader: str = "") -> str:
    """The one line for an attribute ``name`` that a rebuilt original does not have, and how
    to give the replacement the real module instead, with the program's weights."""
    swap_name, module_name, attribute = rebuilt_as.swap or ("NAME", "MODULE", "Replacement")
    reader = reader or (
        f"the replacement made by {module_name}:{attribute}"
        if rebuilt_as.swap
        else "the replacement"
    )
    real = rebuilt_as.swapped_type.rpartition(".")[2] or "TheModule"
    recorded = f" ({rebuilt_as.type_name})" if rebuilt_as.type_name else ""
    return (
        f"{reader} reads {rebuilt_as.path}.{name}, which {rebuilt_as.fqn}{recorded} rebuilt from "
        "the program does not have: a .pt2 keeps a module's parameters, buffers and submodules, "
        "not its other attributes; build the real module in a function of yours and load the "
        f"program's weights into it, def build(original): real = {real}(config); "
        f"real.load_state_dict(original.state_dict()); return {attribute}(real), as --swap "
        f"{swap_name}={module_name}:build"
    )


def _explain_missing_attributes(original, fqn: str, program, swap: tuple[str, str, str]):
    """Give each module of ``original`` (the program's module ``fqn``, rebuilt for ``swap``) a
    class of its own that says what it lacks (see _Rebuilt); the rebuilt modules are the
    command's own, nothing else holds them."""
    import graphsurgeon as gs

    tree = gs.module_tree(program)

    def recorded(name: str) -> str:
        return tree[name].qualified_type if name in tree else ""

    for sub, module in original.named_modules():
        kind = type(module)
        if isinstance(module, _Rebuilt):  # passed to another --swap too: which one is unknown
            kind._rebuilt_as = dataclasses.replace(kind._rebuilt_as, swap=None)
            continue
        full = f"{fqn}.{sub}" if sub else fqn
        path = f"original.{sub}" if sub else "original"
        rebuilt_as = _RebuiltAs(full, recorded(full), path, recorded(fqn), swap)
        namespace = {"_rebuilt_as": rebuilt_as, "__module__": kind.__module__}
        module.__class__ = type(kind.__name__, (_Rebuilt, kind), namespace)


def _original_module(spec: str, program, name: str, rebuilt: dict):
    """The program's module ``name`` rebuilt as a plain nn.Module (the hierarchy is rebuilt
    once for all the --swap options that need it), whose missing attributes say so."""
    from graphsurgeon._hierarchy import rebuild_hierarchy
    from graphsurgeon.errors import did_you_mean

    fqn = name.partition("@")[0]
    if "hierarchy" not in rebuilt:
        try:
            rebuilt["hierarchy"] = rebuild_hierarchy(program, {})[0]
        except GraphSurgeonError as error:
            raise SystemExit(
                _fail(f"--swap {spec}: the original module cannot be rebuilt to pass it: {error}")
            ) from None
    hierarchy = rebuilt["hierarchy"]
    try:
        original = hierarchy.get_submodule(fqn) if fqn else hierarchy
    except AttributeError:
        names = [n for n, _ in hierarchy.named_modules() if n]
        raise SystemExit(
            _fail(f"--swap {spec}: the program has no module {fqn!r}.{did_you_mean(fqn, names)}")
        ) from None
    _explain_missing_attributes(original, fqn, program, _parse_swap(spec))
    return original


def _tolerance(text: str) -> float:
    """A tolerance option: a finite number >= 0 (argparse's own type error otherwise)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use e.g. 1e-5") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a finite number >= 0, e.g. 1e-5")
    return value


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e6 else f"{max(1, round(count / 1e3))} KB"


def _cmd_report(options) -> int:
    import graphsurgeon as gs
    from graphsurgeon.report import build_report

    names = [_parse_swap(spec)[0] for spec in options.swap]  # the forms, before the slow load
    for spec, name in zip(options.swap, names):
        if names.count(name) > 1:
            return _fail(f"--swap {spec}: {name!r} is swapped twice; give one --swap per module")
    if options.output != "-":
        _check_output(options.output, _REPORT_SUFFIXES, options.program)
    program = _load_program(options.program, trust=options.trust_file, imports=options.imports)
    surgery = gs.Surgery(program)
    sources: dict[str, str] = {}
    rebuilt: dict = {}
    for spec in options.swap:
        name, replacement, sources[name] = _replacement(spec, program, rebuilt)
        try:
            surgery.swap(name, replacement)
        except GraphSurgeonError as error:
            # on the command line, the command line's way to list the modules
            listing = f"`graphsurgeon modules {options.program}`"
            return _fail(f"--swap {spec}: {str(error).replace('gs.module_tree(ep)', listing)}")
    title = (
        options.title or f"{gs.module_tree(program).root.type_name} ({Path(options.program).name})"
    )
    report = build_report(
        surgery,
        title=title,
        sources=sources,
        rtol=options.rtol,
        atol=options.atol,
        overlay=options.overlay.replace("-", " ") if options.overlay else None,
    )
    to_stdout = options.output == "-"
    if to_stdout:
        _out(report.html, end="")
    else:
        try:
            report.save(options.output)
        except OSError as error:
            return _fail(f"{options.output}: cannot write ({error.strerror or error})")
    shown = ["the module tree"]
    if not report.picture:  # else the summary below says why there is none
        shown.append("the before/after picture" if surgery.replacements else "the picture")
    if report.verify is not None:
        shown.append("verify and compare")
    shown.append("export notes")
    lines = [
        f"{'report' if to_stdout else options.output}: {_size(len(report.html.encode()))}, "
        f"{', '.join(shown)}",
        *report.summary(),
    ]
    for line in lines:
        if to_stdout:
            print(line, file=sys.stderr)
        else:
            _out(line)
    return 0 if report.ok else 1


# The demo swaps layers.1.attn (so 2 at least) and builds the model on the spot (a bound keeps
# a typo such as --layers 40000 from filling the memory).
_DEMO_LAYERS = (2, 64)
# Under out/, which a checkout of graphsurgeon ignores (the screenshots of the tests go there).
_DEMO_REPORT = os.path.join("out", "demo-report.html")


def _cmd_demo(options) -> int:
    import torch

    import graphsurgeon as gs
    from graphsurgeon.checks.verify import eager_reference
    from graphsurgeon.examples import FusedAttention, GeluTanhMLP, TinyGPT
    from graphsurgeon.swap import swap_info

    if not _DEMO_LAYERS[0] <= options.layers <= _DEMO_LAYERS[1]:
        return _fail(
            f"--layers {options.layers}: the demo swaps the attention of layers.1, so it needs "
            f"{_DEMO_LAYERS[0]} to {_DEMO_LAYERS[1]} layers (the default is 4)"
        )
    if options.rounds < 1:
        return _fail(f"--rounds {options.rounds}: the forward is timed over at least 1 round")
    torch.manual_seed(0)
    model = TinyGPT(n_layers=options.layers).eval()
    tokens = model.example_input()
    _out(f"model: TinyGPT, {options.layers} layers, hidden 64; input tokens {list(tokens.shape)}")

    start = time.perf_counter()
    ep = gs.export(model, (tokens,))
    export_s = time.perf_counter() - start
    tree = gs.module_tree(ep)
    _out(
        f"exported: {len(ep.graph.nodes)} graph nodes, {len(tree) - 1} modules in {export_s:.2f} s\n"
    )
    _out(tree.table())

    replacements = {"layers.1.attn": FusedAttention(model.layers[1].attn)}
    _out(
        "\nswap: layers.1.attn (Attention, written out) -> FusedAttention (scaled_dot_product_attention)"
    )
    start = time.perf_counter()
    swapped = gs.swap(ep, replacements)
    swap_s = time.perf_counter() - start
    info = swap_info(swapped)
    for call, node in info.call_nodes.items():
        removed = len(info.partitions[call].nodes)
        _out(f"  {call}: {removed} graph nodes -> one call ({node}) in {swap_s * 1e3:.1f} ms")

    reference = eager_reference(model, replacements)
    report = gs.verify(reference, swapped, (tokens,))
    _out("\nswapped program vs eager model with the same replacement:")
    _out("  " + str(report).replace("\n", "\n  "))
    against_original = gs.verify(model, swapped, (tokens,), rtol=1e-4, atol=1e-5)
    _out("swapped program vs the original model (is the fused attention equivalent?):")
    _out("  " + str(against_original).replace("\n", "\n  "))

    approx = {"layers.3.mlp": GeluTanhMLP(model.layers[3].mlp)} if options.layers > 3 else {}
    ok = bool(report) and bool(against_original)
    if approx:
        _out("\nswap: layers.3.mlp -> GeluTanhMLP (tanh approximation of GELU: close, not equal)")
        drifted = gs.swap(ep, {**replacements, **approx})
        drift = gs.verify(model, drifted, (tokens,))
        _out("  " + str(drift).replace("\n", "\n  "))
        _out("  (a mismatch is expected here: verify reports it instead of raising)")

    with torch.no_grad():
        # interleaved runs, medians: drift on a busy machine hits both alike
        runs: dict[str, list[float]] = {"eager": [], "swapped": []}
        for _ in range(5):
            reference(tokens), swapped(tokens)
        for _ in range(options.rounds):
            for name, module in (("eager", reference), ("swapped", swapped)):
                start = time.perf_counter()
                module(tokens)
                runs[name].append(time.perf_counter() - start)
        timings = {name: statistics.median(values) for name, values in runs.items()}
    _out(
        f"\ntimings: export {export_s:.2f} s, swap {swap_s * 1e3:.1f} ms, forward "
        f"{timings['swapped'] * 1e3:.2f} ms (eager reference {timings['eager'] * 1e3:.2f} ms, "
        f"ratio {timings['swapped'] / timings['eager']:.2f}x)"
    )

    surgery = gs.Surgery(ep, model=model, args=(tokens,))
    for name, replacement in {**replacements, **approx}.items():
        surgery.swap(name, replacement)
    description = (
        f"TinyGPT, {options.layers} layers, hidden 64, exported by the graphsurgeon demo. "
        "layers.1.attn is swapped for FusedAttention (scaled_dot_product_attention, the same "
        "computation)"
        + (
            "; layers.3.mlp for GeluTanhMLP (the tanh approximation of GELU: close, not equal, "
            "so verify reports a mismatch and compare shows that it starts there)."
            if approx
            else "."
        )
    )
    written = _write_demo_report(surgery, options.report, options.layers, description)
    if written is None:
        return 2
    _out(
        f"\nreport: {options.report} ({written}): the module tree, the before/after picture, "
        "verify and compare, export notes; one HTML file, open it in a browser"
    )
    _out("tutorials: `make lab` (in a checkout of graphsurgeon) opens the notebooks in JupyterLab")
    return 0 if ok else 1


def _write_demo_report(surgery, path_text: str, layers: int, description: str) -> str | None:
    """Write the demo's report; its size as text, or None (the error said) if it cannot."""
    from graphsurgeon.report import build_report

    # the tolerances of the demo's check against the original model (fused attention rounds
    # differently, within 1e-4)
    report = build_report(
        surgery,
        title=f"graphsurgeon demo: TinyGPT, {layers} layers",
        description=description,
        rtol=1e-4,
        atol=1e-5,
    )
    path = Path(path_text)
    try:
        if not path.parent.exists():  # out/ the first time (a file there: the write says so)
            path.parent.mkdir(parents=True)
        report.save(path)
    except OSError as error:
        _fail(
            f"{path}: cannot write the report ({error.strerror or error}); choose another file with --report"
        )
        return None
    return _size(len(report.html.encode()))


def _add_reading_options(command: argparse.ArgumentParser) -> None:
    """The options of every command that reads a program: what it may import and run."""
    command.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=_IMPORT_HELP,
    )
    command.add_argument("--trust-file", action="store_true", help=_TRUST_HELP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphsurgeon",
        description="Swap modules of torch.export programs for eager code, and check the result.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="export a built-in transformer, swap a layer, verify, write a report"
    )
    demo.add_argument("--layers", type=int, default=4, help="decoder layers, 2 to 64 (default 4)")
    demo.add_argument(
        "--rounds", type=int, default=100, help="timed forward runs of each model (default 100)"
    )
    demo.add_argument(
        "-o",
        "--report",
        default=_DEMO_REPORT,
        metavar="FILE",
        help=f"the HTML report written at the end (default {_DEMO_REPORT})",
    )
    demo.set_defaults(run=_cmd_demo)

    modules = commands.add_parser(
        "modules",
        help="the module tree of a .pt2 program as a table",
        description="Print the module tree of a program saved with torch.export.save: calls, "
        "nodes, swappable or why not.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modules.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    _add_reading_options(modules)
    modules.set_defaults(run=_cmd_modules)

    render = commands.add_parser(
        "render",
        help="draw a .pt2 program with its module partitions (SVG, PNG, PDF or DOT)",
        description="Draw a program saved with torch.export.save, one cluster per module.",
        epilog=_TRUST_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    render.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="out.svg, out.png, out.pdf or out.dot (default: DOT text on standard output)",
    )
    render.add_argument(
        "--collapse",
        default="auto",
        metavar="WHAT",
        help="modules drawn as one box: auto (default: at most --max-nodes nodes), none, a "
        "depth (1: every top-level module), or comma-separated module names",
    )
    render.add_argument(
        "--highlight",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module to make stand out (repeat, or separate names with commas)",
    )
    render.add_argument(
        "--max-nodes", type=int, default=300, help="the node budget of --collapse auto (300)"
    )
    render.add_argument(
        "--show-parameters", action="store_true", help="draw parameters as nodes of their own"
    )
    _add_reading_options(render)
    render.set_defaults(run=_cmd_render)

    report = commands.add_parser(
        "report",
        help="one self-contained HTML page of a .pt2 program, with swaps checked",
        description="Write one HTML file (it loads nothing from any network) of a program\n"
        "saved with torch.export.save: the module tree, the picture (before/after with --swap,\n"
        "zoomable), verify and compare of the swaps, and the export notes.",
        epilog=f"{_SWAP_HELP}\n{_TRUST_NOTE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("program", help="a program saved with torch.export.save (.pt2)")
    report.add_argument(
        "--swap",
        action="append",
        default=[],
        metavar="NAME=MODULE:ATTR",
        help="replace module NAME by MODULE.ATTR: an nn.Module, or a class or function called "
        "with no arguments or with the original module (repeat for more; see below)",
    )
    report.add_argument(
        "-o",
        "--output",
        default="report.html",
        metavar="FILE",
        help="the HTML file to write, never the program itself (default: report.html; - for "
        "standard output)",
    )
    report.add_argument("--title", help="the page's title (default: the model type and file)")
    report.add_argument(
        "--rtol", type=_tolerance, default=1e-5, help="relative tolerance of the checks (1e-5)"
    )
    report.add_argument(
        "--atol", type=_tolerance, default=1e-5, help="absolute tolerance of the checks (1e-5)"
    )
    report.add_argument(
        "--overlay",
        choices=("error", "own-error", "latency"),
        help="also paint the picture: error (the swapped program against the original), "
        "own-error (each swapped call on the original's inputs) or latency (time per node)",
    )
    _add_reading_options(report)
    report.set_defaults(run=_cmd_report)

    options = parser.parse_args(argv)
    try:
        return options.run(options)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except _OutputFailed as failed:
        _silence_stdout()
        reason = failed.error.strerror or str(failed.error)
        return _fail(f"cannot write to standard output ({reason}); redirect it to a file with room")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
