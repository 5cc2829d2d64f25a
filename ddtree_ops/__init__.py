"""ddtree-ops: deploy and operate SGLang with DFlash / DDTree speculative decoding.

One source of truth: :mod:`ddtree_ops.config` validates a deployment and derives the
CUDA-graph sizes; :mod:`ddtree_ops.render` turns it into argv and files; Ansible and the
``ddtree-ops`` CLI both call the same renderer.
"""

__version__ = "0.1.0"
