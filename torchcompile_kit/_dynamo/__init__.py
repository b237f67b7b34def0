"""The only door to torch's private compiler APIs (one module per concern, re-exported here).

Each use says why it is needed, where upstream it comes from, and when it can go;
``tests/test_layout.py`` fails if any other module of the package names a private compiler name.
Nothing runs at import time beyond importing torch: a missing name is a clear error where it is used.
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
    nested,
    optim,
    paths,
    precompile,
    trace,
)
from .cache import *  # noqa: F403
from .counting import *  # noqa: F403
from .doctor import *
from .hook_guards import *  # noqa: F403
from .inductor import *  # noqa: F403
from .isa_probe import *  # noqa: F403
from .limits import *  # noqa: F403
from .marking import *  # noqa: F403
from .modules import *  # noqa: F403
from .nested import *  # noqa: F403
from .optim import *  # noqa: F403
from .paths import *  # noqa: F403
from .precompile import *  # noqa: F403
from .trace import *  # noqa: F403

__all__ = [*cache.__all__, *counting.__all__, *doctor.__all__, *hook_guards.__all__, *inductor.__all__,
           *isa_probe.__all__, *limits.__all__, *marking.__all__, *modules.__all__, *nested.__all__,
           *optim.__all__, *paths.__all__, *precompile.__all__, *trace.__all__]
