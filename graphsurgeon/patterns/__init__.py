"""Patterns of ops that are no module's: found by dataflow, or chosen by hand.

- :mod:`.find`: where the ops of a function or module occur in a program, with near-misses
  (``gs.find``; ``s.replace`` makes each match one call);
- :mod:`.region`: a set of a program's nodes chosen by hand as one call (``s.swap_region``,
  ``s.fuse_region``, ``s.find_similar``).
"""
