"""Imports TensorFlow with its C++ log quiet, unless you asked for that log.

The examples import this module before TensorFlow. Unless
``TF_CPP_MIN_LOG_LEVEL`` is already set, it sets it to 3, which leaves out
TensorFlow's C++ notices and errors (on a machine without a GPU, a failed
CUDA initialization is logged as an error), and it sends the lines
TensorFlow's libraries print while they load, before any log level applies
(oneDNN, CUDA drivers, CPU features), to ``os.devnull`` with the rest of
standard error for the time of the import. Exceptions still show: an import
that fails raises once standard error is back.

To see TensorFlow's log again, set the level yourself:
``TF_CPP_MIN_LOG_LEVEL=0 python examples/quickstart.py`` shows all of it.
"""

import os
import sys

if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    _stderr = os.dup(2)
    try:
        with open(os.devnull, "w") as _devnull:
            os.dup2(_devnull.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            finally:
                os.dup2(_stderr, 2)
    finally:
        os.close(_stderr)
