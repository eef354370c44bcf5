"""A toy kernel family — a plain product ``C = A·B``, its epilogue left to TVM — written only
against the family contract (:mod:`tvm_stitch.families`): one folder, registered by one line in
``tests/test_families.py``."""
