"""Reading the pickled image releases (CIFAR python batches, downsampled ImageNet) safely.

A pickle can import and call anything, so a tampered download could run code when loaded.
:class:`RestrictedUnpickler` imports only numpy's array and scalar reconstructors and the
bytes codec of protocol 2: a file that names anything else is refused with a
:class:`~kattn.data.base.DataFormatError`.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, BinaryIO

from .base import DataFormatError

#: what an unpickled batch may reference: numpy arrays (as written by numpy 1 and 2, pickle
#: protocols 2–5), numpy scalars and the bytes codec of protocol 2. Nothing else is imported,
#: so a tampered file cannot run code.
PICKLE_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


class RestrictedUnpickler(pickle.Unpickler):
    """Reads py2 and py3 pickles (py2 strings come back as bytes: ``encoding="bytes"``),
    importing only :data:`PICKLE_GLOBALS`.

    Args:
        file: the open binary file.
        what: what the file should be, for the refusal message (``"a CIFAR-10 batch"``).
    """

    def __init__(self, file: BinaryIO, *, what: str) -> None:
        super().__init__(file, encoding="bytes")
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in PICKLE_GLOBALS:
            raise DataFormatError(
                f"refusing to load {module}.{name}: {self.what} holds only numpy arrays and lists"
            )
        return super().find_class(module, name)


def load_pickle(path: Path, *, what: str, expected: str) -> Any:
    """The object pickled in ``path``, read through :class:`RestrictedUnpickler`.

    Args:
        path: the file.
        what: what it should be, without article (``"CIFAR-10 batch"``).
        expected: what it should hold, for the message when it is missing.

    Raises:
        DataFormatError: the file is missing, truncated, not a pickle, or imports anything but
            numpy arrays (the message names the file).
    """
    if not path.is_file():
        raise DataFormatError(f"{path} is missing: expected the {what} ({expected})")
    with path.open("rb") as file:
        try:
            return RestrictedUnpickler(file, what=f"a {what}").load()
        except Exception as err:  # a truncated or foreign file can fail in many ways
            raise DataFormatError(f"{path} is not a readable {what}: {err}") from None
