"""Reading a program file (a ``.pt2``) safely, for the ``graphsurgeon`` command.

A .pt2 is code. torch.export.load unpickles what the file holds (its example inputs, weights
that are tensor subclasses, opaque constants) and retries a weights-only unpickling that fails
with a full one, which calls whatever the pickle names; it also loads the compiled AOTInductor
libraries a package may hold. Unless told to trust the file, :func:`load_program` loads it with
every unpickling restricted to tensors and plain values, and refuses what needs more; what it
cannot read or refuses raises :class:`CannotLoad`, whose message is the one line the command
prints.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import pickle
import re
import stat
import sys
import warnings
import zipfile
import zlib
from pathlib import Path

__all__ = ["CannotLoad", "first_line", "import_from_here", "load_program"]


class CannotLoad(Exception):
    """A program file that cannot be read, or that reading could run code from (unless
    trusted), or a module that cannot be imported: the message is one line that says why and
    what to do."""


# -- reading a program file ---------------------------------------------------------------------

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


def _refuse_untrusted(path: Path, what: str) -> CannotLoad:
    return CannotLoad(f"{path}: {what}: unpickling it could run code from the file; {_TRUST_HINT}")


def _load_failure(error: BaseException, logged: list[BaseException]) -> str:
    """The cause of a failed load, in one short line of text."""
    if "warnings above" in str(error):  # torch points at what it logged: name that instead
        if not logged:
            return "torch found no exported program in it"
        error = logged[0]
    return _shortened(first_line(error))


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


# torch's error for a spec that names a type it does not know (the serialized type name).
_UNREGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered")


def _import_requested(modules: list[str]) -> None:
    """Import the modules given with ``--import``: the user's consent to run them."""
    for module_name in modules:
        import_from_here(f"--import {module_name}", module_name)


def _spec_types(path: Path) -> dict[str, str]:
    """{serialized type name: where the program first names it, as the start of a sentence
    ("its output is a", "the input of its module 'encoder' holds a")} of the types its specs
    name, read from the archive's JSON (nothing is unpickled); empty when that cannot be read
    (torch's load then says what is wrong)."""

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
                remedy = f"importing {module_name} failed: {first_line(error)}"
            raise CannotLoad(f"{path}: {missing[name]} {_shown(name)}; {remedy}") from None
        imported.add(module_name)
    still = [name for name in missing if name not in registered]
    if still:
        more = f" (and {len(still) - 1} more types)" if len(still) > 1 else ""
        first = still[0]
        raise CannotLoad(_unregistered_type(path, first, missing[first], imported) + more)


def load_program(path_text: str, *, trust: bool = False, imports: list[str] = ()):
    """The ExportedProgram in the file ``path_text``; exit 2 with one line when it cannot be
    read, or, unless ``trust``, when reading it could run code from it. The modules
    ``imports`` are imported first, and the known modules of the types its specs name (see
    ``_KNOWN_TYPE_MODULES``)."""
    import torch

    path = Path(path_text)
    try:
        mode = path.stat().st_mode  # through links: what a link names is what would be read
    except FileNotFoundError:
        raise CannotLoad(f"{path}: no such file") from None
    except OSError as error:  # a name too long, a loop of links: the path cannot be looked at
        raise CannotLoad(f"{path}: cannot read ({error.strerror or error})") from None
    if stat.S_ISDIR(mode):
        raise CannotLoad(f"{path}: is a directory, expected a .pt2 file")
    if not stat.S_ISREG(mode):
        # opening a named pipe waits for a writer, forever; a device such as /dev/zero never ends
        raise CannotLoad(
            f"{path}: is {_file_kind(mode)}, not a regular file; expected a .pt2 file saved "
            "with torch.export.save"
        )
    if path.suffix != ".pt2":
        raise CannotLoad(
            f"{path}: expected a .pt2 file saved with torch.export.save, got {path.suffix or 'no suffix'!r}"
        )
    if not trust:
        compiled = _compiled_code(path)
        if compiled is not None:
            raise CannotLoad(
                f"{path}: {compiled} is compiled AOTInductor code, which torch.export.load "
                f"loads as a shared library and so runs; {_TRUST_HINT}"
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
            raise CannotLoad(message) from None
        raise CannotLoad(
            f"{path}: not a readable torch.export program ({_load_failure(error, logged)})"
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


def import_from_here(option: str, module_name: str):
    """Import ``module_name`` with the current directory first on sys.path, as ``python -m``
    does (a console script's sys.path starts with its own folder instead); exit 2 with one
    line that starts with ``option`` (``--swap NAME=MODULE:ATTR``) when it cannot be."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise CannotLoad(
                f"{option}: no Python module {module_name!r} in the current directory "
                "or on sys.path; run from the folder that holds it, or add that folder to "
                "PYTHONPATH"
            ) from None
        raise CannotLoad(
            f"{option}: importing {module_name!r} failed: {first_line(error)}"
        ) from None
    except Exception as error:  # its own code raised (a SyntaxError, an ImportError, ...)
        raise CannotLoad(
            f"{option}: importing {module_name!r} failed: {first_line(error)}"
        ) from None
    finally:
        sys.path[:] = saved


def first_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
