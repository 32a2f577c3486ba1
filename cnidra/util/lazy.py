"""A package whose `__init__` runs only when something asks it for a name it defines.

Some libraries' `__init__` imports every part they have, so that `from lib import X` works
for any X: uvicorn's loads its command line (click, the reload supervisors, multiprocessing)
for a driver that takes its `Config` and `Server` alone. `defer_init("uvicorn")` puts the
package in `sys.modules` with its path set but its `__init__` not run: a submodule
(`uvicorn.config`) imports as usual, and the first other name asked of the package itself
(`uvicorn.run`) runs the real `__init__` then, so nothing that uses the library another way sees
a difference. `exports` names what the `__init__` re-exports from its own submodules (name ->
submodule) for the package's modules that import it from there (uvicorn's lifespan does `from
uvicorn import Config`): such a name is the submodule's object, the one the `__init__` binds,
and the `__init__` still waits for a name not listed."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from typing import Any


def defer_init(name: str, exports: Mapping[str, str] | None = None) -> bool:
    """Whether the package's `__init__` was deferred (False: imported already, or not a
    package that can be)."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    exported = dict(exports or {})

    def complete(attribute: str) -> Any:
        """A submodule, imported; an exported name, from its submodule; any other name: the
        package's own `__init__`, run once."""
        if attribute.startswith("__"):
            raise AttributeError(attribute)  # copy, pickle and the import system probe these
        if attribute in exported:
            value = getattr(importlib.import_module(f"{name}.{exported[attribute]}"), attribute)
            module.__dict__[attribute] = value
            return value
        if importlib.util.find_spec(f"{name}.{attribute}") is not None:
            return importlib.import_module(f"{name}.{attribute}")
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, attribute)

    module.__dict__["__getattr__"] = complete
    sys.modules[name] = module
    return True
