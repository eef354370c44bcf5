"""A differential fuzzer: random Relax programs built by the stitch pipeline and by TVM's default
pipeline, compared.

>>> from tvm_stitch.fuzz import generate, check
>>> check(generate(7), cuda=True).status
'ok'

``python -m tvm_stitch.fuzz --count 2000 --cuda`` runs a campaign (``--help``); a failure is
shrunk to a small reproducer (:func:`minimize`) and written out as JSON and TVMScript.
"""

from .differential import STAGES, Outcome, check
from .programs import Program, generate
from .shrink import minimize

__all__ = ["STAGES", "Outcome", "Program", "check", "generate", "minimize"]
