"""zettelq worker: the Celery side that organises memories (see docs/architecture.md).

A worker process does its numeric work on one thread: the matrices of one batch are small, and
an idle BLAS thread pool spins on a second core (OpenBLAS's helper thread took a third of a core
beside a one-process worker, CPU that a second worker process on the host needs). Workers scale
by processes. The pools are capped here, before numpy or FAISS load, unless the environment
already sets them.
"""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
