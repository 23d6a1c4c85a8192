"""The checks: does a swapped program compute what it should, and where does it not?

- :mod:`.verify`: a candidate against a reference on the same inputs, output leaf by leaf
  (``gs.verify``), and the eager reference of a swap (``eager_reference``);
- :mod:`.compare`: each swapped call against the original nodes it replaced, on the inputs it
  received (``gs.compare``);
- :mod:`.locate`: inside a diverging call, the first op of the replacement that differs;
- :mod:`.bisect`: which of a Surgery's swaps explain its mismatch (``s.bisect()``);
- :mod:`.overlay`: per-node and per-call errors and timings painted on the picture;
- :mod:`._exec`: the one node-by-node runner, runnable originals, state kept and put back;
- :mod:`._eager_calls`: what eager passes a swapped module, against what the program passes.

Each is imported where it is used (``import graphsurgeon`` loads only verify and compare).
"""
