"""Callbacks named by where their class lives: a Python file or an importable module.

Beside registered names (``ema``), ``--callback`` and a config's ``callbacks:`` take a
class path, with the same ``:key=value,...`` arguments::

    --callback my_callbacks.py:EmbedNorm:scale=2     # a file (relative to the working directory)
    --callback mypkg.callbacks:EmbedNorm:scale=2     # a module on the Python path
    --callback mypkg.callbacks.EmbedNorm             # the same, written as one dotted name
    --callback my_callbacks:EmbedNorm:scale=2        # a top-level module (my_callbacks.py
                                                     # on PYTHONPATH)

``NAME:Identifier`` is a class path when ``NAME`` is no registered callback and
``Identifier`` is no ``key=value``; where ``NAME`` is a registered callback too
(``ema:EmbedNorm``), it is refused in one line saying how to write each meaning
(``ema.EmbedNorm`` for the module's class, ``ema:key=value`` for the callback).

A file's path is recorded resolved (absolute), so a resume rebuilds the same class
from another working directory. From code::

    is_class_path("ema")                                # False: a registered name
    is_class_path("my_callbacks:EmbedNorm")             # True: no callback is my_callbacks
    target, rest = split_class_path("my_callbacks.py:EmbedNorm:scale=2", "--callback ...")
    # ("/home/me/exp/my_callbacks.py:EmbedNorm", "scale=2")
    load_class(target, "--callback ...")                # the class, a Callback subclass
    class_label(target)                                 # "EmbedNorm" (--allow-changed EmbedNorm.scale)

Reward functions are named the same way (``--reward rewards.py:fn``, ``--reward
mypkg.rewards:fn``): the functions here take a :class:`PathKind` that words their
messages for what is named, and :func:`load_module` gives the module either names.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from baton.core.callback import Callback
from baton.core.errors import UsageError, did_you_mean
from baton.core.registry import CALLBACKS, Registry

#: the module names files are imported under (``baton_callback_file__home_me_cb_py``)
FILE_MODULE_PREFIX = "baton_callback_file_"
#: files already imported, by resolved path: a class loaded twice is the same class
_FILES: dict[Path, ModuleType] = {}


@dataclass(frozen=True)
class PathKind:
    """What a path names, for the words of its messages: the flag, the component (a
    callback), what the code defines (a class) and examples of both forms."""

    flag: str
    component: str
    #: a registered name, for examples
    name_example: str
    defines: str
    #: the placeholder messages write, ``FILE.py:Class``
    placeholder: str
    #: ``mypkg.callbacks:MyCallback``
    module_example: str
    #: ``my_callbacks.py:MyCallback``
    file_example: str
    #: the names registered for this flag (``NAME:Identifier`` is a path unless ``NAME``
    #: is one of them)
    registry: Registry[Any] = CALLBACKS

    @property
    def example_name(self) -> str:
        return self.file_example.rpartition(":")[2]


#: a callback class: ``--callback FILE.py:Class``
CALLBACK_PATH = PathKind(
    "--callback",
    "callback",
    "goodput",
    "class",
    "Class",
    "mypkg.callbacks:MyCallback",
    "my_callbacks.py:MyCallback",
)


def is_class_path(text: str, kind: PathKind = CALLBACK_PATH) -> bool:
    """Whether ``text`` (``--callback``'s, or another ``kind``'s flag's, as given) names a
    class by file or module rather than by registered name: its part before the first
    ``:`` is a path or dotted, or it is ``NAME:Identifier`` with ``NAME`` not registered
    (a top-level module) and ``Identifier`` no ``key=value``. ``NAME:Identifier`` with a
    registered ``NAME`` is ambiguous: a ``UsageError`` saying how to write either meaning."""
    head, _, rest = text.partition(":")
    if _is_file(head) or "." in head:
        return True
    first = rest.partition(":")[0].strip()
    if not head.strip() or not first.isidentifier():
        return False
    if head.strip() not in kind.registry:
        return True
    flag = kind.flag
    raise UsageError(
        f"{flag} {text}: {head!r} is a registered {kind.component} and {first!r} is not "
        f"key=value; for the registered {kind.component} write {flag} {head}:key=value, for "
        f"the {kind.defines} {first} of a module {head} write {flag} {head}.{first}"
    )


def names_class(name: str) -> bool:
    """Whether a callback's name as recorded (``normal_name``) is a class path,
    ``TARGET:Class``; registered names have no ``:``."""
    return ":" in name


def _is_file(head: str) -> bool:
    return head.endswith(".py") or "/" in head or "\\" in head


def split_class_path(text: str, source: str, kind: PathKind = CALLBACK_PATH) -> tuple[str, str]:
    """``(TARGET:Class, arguments text)`` of a class path as given: a file resolved to
    an absolute path, ``pkg.mod.Class`` written ``pkg.mod:Class`` (the same for any
    ``kind``: ``pkg.mod.fn`` is ``pkg.mod:fn``)."""
    head, _, rest = text.partition(":")
    class_name, _, after = rest.partition(":")
    class_name = class_name.strip()
    if _is_file(head):
        if not class_name.isidentifier():
            raise UsageError(
                f"{source}: name the {kind.defines} in {head}, e.g. {kind.flag} "
                f"{head}:{kind.example_name}{':' + rest if rest else ''}"
            )
        return f"{Path(head).expanduser().resolve()}:{class_name}", after
    if class_name.isidentifier():
        return f"{head}:{class_name}", after
    module, _, attr = head.rpartition(".")
    if not module or not attr.isidentifier():
        raise UsageError(
            f"{source}: {head!r} names no {kind.defines}; write MODULE:{kind.placeholder} "
            f"({kind.module_example}) or FILE.py:{kind.placeholder}"
        )
    return f"{module}:{attr}", rest


def normal_name(text: str, source: str, kind: PathKind = CALLBACK_PATH) -> str:
    """A callback's (or another ``kind``'s) name as recorded: a registered name
    unchanged, a class path as ``split_class_path`` writes it (arguments not allowed here)."""
    if not is_class_path(text, kind):
        return text
    target, rest = split_class_path(text, source, kind)
    if rest.strip():
        raise UsageError(f"{source}: {text!r}: give the arguments as the entry's own keys")
    return target


def class_label(name: str) -> str:
    """How messages and ``--allow-changed`` name a callback: the registered name, or a
    class path's class name (``/x/my_callbacks.py:EmbedNorm`` -> ``EmbedNorm``)."""
    return name.rpartition(":")[2]


def load_class(target: str, source: str) -> type[Callback]:
    """The ``Callback`` subclass ``target`` (``FILE.py:Class`` or ``module:Class``)
    names; a missing file or module, a missing class or one that is not a baton
    ``Callback`` is a one-line ``UsageError``."""
    where, _, name = target.rpartition(":")
    module = load_module(target, source)
    found = getattr(module, name, None)
    if not isinstance(found, type):
        own = [
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Callback) and v.__module__ == module.__name__
        ]
        close = did_you_mean(name, own)
        hint = (
            f"did you mean {close!r}?"
            if close
            else f"its callbacks: {', '.join(own)}"
            if own
            else "define a subclass of baton.core.Callback there"
        )
        raise UsageError(f"{source}: {where} defines no class {name!r}; {hint}")
    if not issubclass(found, Callback):
        raise UsageError(
            f"{source}: {where}:{name} is not a baton Callback; make it a subclass of "
            "baton.core.Callback (class "
            f"{name}(Callback): ...)"
        )
    return found


def load_module(target: str, source: str, kind: PathKind = CALLBACK_PATH) -> ModuleType:
    """The module of ``target`` (``FILE.py:name``: the file, imported once; ``module:name``:
    the module imported); a missing or failing file or module is a one-line
    ``UsageError`` worded for ``kind``."""
    where, _, name = target.rpartition(":")
    if _is_file(where):
        return _load_file(Path(where), source, kind)
    return _import(where, name, source, kind)


def _load_file(path: Path, source: str, kind: PathKind) -> ModuleType:
    if path in _FILES:
        return _FILES[path]
    if not path.is_file():
        raise UsageError(
            f"{source}: {kind.component} file {path} does not exist; give the path of a Python "
            f"file that defines the {kind.defines}, e.g. {kind.flag} {kind.file_example}"
        )
    module_name = FILE_MODULE_PREFIX + re.sub(r"\W", "_", str(path))
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{source}: {path} is not a Python file; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # annotations and dataclasses look it up
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        del sys.modules[module_name]
        raise UsageError(
            f"{source}: {path}:{error.lineno}: syntax error ({error.msg}); fix the file"
        ) from None
    except Exception as error:
        del sys.modules[module_name]
        raise UsageError(
            f"{source}: {path} raised {type(error).__name__} while loading: {error}; fix the "
            "file (or install what it imports)"
        ) from None
    _FILES[path] = module
    return module


def _import(module: str, name: str, source: str, kind: PathKind) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and module.startswith(error.name):
            close = None if "." in module else did_you_mean(module, kind.registry.names())
            registered = f" (the registered {kind.component} {close!r}?)" if close else ""
            raise UsageError(
                f"{source}: no module named {module!r}{registered}; install the package "
                f"that provides it, put its file on PYTHONPATH, or give a file: {kind.flag} "
                f"path/to/file.py:{name}"
            ) from None
        raise UsageError(
            f"{source}: module {module} cannot be imported: {error}; install what it needs"
        ) from None
    except Exception as error:
        raise UsageError(
            f"{source}: importing {module} raised {type(error).__name__}: {error}; fix the module"
        ) from None


__all__ = [
    "CALLBACK_PATH",
    "FILE_MODULE_PREFIX",
    "PathKind",
    "class_label",
    "is_class_path",
    "load_class",
    "load_module",
    "names_class",
    "normal_name",
    "split_class_path",
]
