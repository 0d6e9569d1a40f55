"""Objects whose attribute set is fixed, as a pybind11 class's is: assigning a name the class does not
declare raises AttributeError ("'X' object has no attribute 'y'"), exactly what
`torch._C._distributed_c10d` options objects do (checked on torch 2.13:
`ProcessGroupGloo._Options().bogus = 1` raises that AttributeError)."""
from __future__ import annotations

from typing import Any


class FixedFields:
    """Subclasses list their fields in `_FIELDS`; `_READ_ONLY` ones can be read but not assigned."""

    _FIELDS: tuple[str, ...] = ()
    _READ_ONLY: tuple[str, ...] = ()
    _PYBIND_NAME = "Options"

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._READ_ONLY:
            raise AttributeError(f"property of '{self._PYBIND_NAME}' object has no setter")
        if name not in self._FIELDS:
            raise AttributeError(f"'{self._PYBIND_NAME}' object has no attribute '{name}'")
        object.__setattr__(self, name, value)

    def _init(self, **values: Any) -> None:
        """Set the initial values (read-only ones included)."""
        for k, v in values.items():
            object.__setattr__(self, k, v)
