"""The core: what a token costs and where it lives -- plain Python, no torch (lessons 1-3).

* :mod:`~paged_edu.core.memory` -- bytes per token, ``M_KV``, ``eta_naive`` and ``eta_paged`` (lesson 1);
* :mod:`~paged_edu.core.contiguous` -- the contiguous ``L_max`` baseline and its three pathologies (lesson 1);
* :mod:`~paged_edu.core.allocator` -- the paged block allocator: block tables, ref counts, chained
  prefix hashes, copy-on-write (lessons 2-3);
* :mod:`~paged_edu.core.seed_allocator` -- the seed's allocator, kept with its defects as the
  cautionary example of lesson 3.

Nothing here imports the rest of the package, so ``pip install paged_edu`` without extras runs it.
"""
