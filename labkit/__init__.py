"""labkit: the helper package of the OpenXLA GPU Lab Kit.

Import modules by name (``from labkit.hlo import collectives``). Importing labkit does not
import JAX: call ``labkit.env.setup(...)`` first in every notebook and script.
"""

__version__ = "0.1.0"
