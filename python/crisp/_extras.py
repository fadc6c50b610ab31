"""The optional dependencies of crisp's submodules, named by the pip extra that installs them."""
from __future__ import annotations

import importlib

DISTRIBUTION = "crisp-attention"  # the PyPI name (the import name is crisp)


def require(module: str, extra: str, feature: str):
    """Imports ``module`` or raises an ImportError naming ``feature`` and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{feature} needs {module.split('.')[0]}, which is not installed: "
                          f"pip install '{DISTRIBUTION}[{extra}]' ({e})") from e
