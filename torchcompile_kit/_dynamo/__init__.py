"""The only door to torch's private compiler APIs (one module per concern, re-exported here).

Each use says why it is needed, where upstream it comes from, and when it can go;
``tests/test_layout.py`` fails if any other module of the package names a private compiler name.
Nothing runs at import time beyond importing torch: a missing name is a clear error where it is
used.
"""

from __future__ import annotations

from . import (
    cache,
    counting,
    doctor,
    hook_guards,
    inductor,
    isa_probe,
    limits,
    marking,
    modules,
    optim,
    paths,
    precompile,
    trace,
)
from .cache import *
from .counting import *
from .doctor import *
from .hook_guards import *
from .inductor import *
from .isa_probe import *
from .limits import *
from .marking import *
from .modules import *
from .optim import *
from .paths import *
from .precompile import *
from .trace import *

__all__ = [  # noqa: PLE0604 - each module's own __all__, re-exported
    *cache.__all__,
    *counting.__all__,
    *doctor.__all__,
    *hook_guards.__all__,
    *inductor.__all__,
    *isa_probe.__all__,
    *limits.__all__,
    *marking.__all__,
    *modules.__all__,
    *optim.__all__,
    *paths.__all__,
    *precompile.__all__,
    *trace.__all__,
]
