"""``python -m tvm_stitch.fuzz``: see :mod:`tvm_stitch.fuzz.campaign`."""

import sys

from tvm_stitch.fuzz.campaign import main

sys.exit(main())
