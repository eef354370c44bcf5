"""``python -m tvm_stitch`` is the ``tvm-stitch`` command."""

import sys

from .cli import main

sys.exit(main())
