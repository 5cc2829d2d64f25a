"""The standard-library core of ddtree-ops: what every layer may import, and what the
preflight zipapp carries onto a GPU host before ddtree-ops is installed (it imports nothing
outside the standard library and nothing else of this package; ``tests/test_layers.py``
holds it to that).

* :mod:`.bounded`: the bounded read of a file taken from a user, the flat nesting scan;
* :mod:`.strictjson`: the strict JSON (RFC 8259) parser, each caller with its own messages;
* :mod:`.proc`: the bounded subprocess runner (total deadline, bounded output, group kill);
* :mod:`.scrub`: the standard-library secret scrubber's pattern table and the one-line cleaner.

The plan.json loader every reader uses is :mod:`ddtree_ops._core.plandoc` (standard library too).
"""
