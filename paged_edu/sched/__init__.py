"""The scheduler half of serving, shared by the engine and the simulator (lessons 5-7; plain Python,
no torch).

* :mod:`~paged_edu.sched.sequence` -- one request's state as the scheduler sees it (lesson 5);
* :mod:`~paged_edu.sched.scheduler` -- continuous batching, chunked prefill, prefix hits, preemption
  by recompute or swap (lessons 5-6), with its parts:
  :mod:`~paged_edu.sched.memory_manager` (the ``MemoryManager`` protocol it drives),
  :mod:`~paged_edu.sched.admission` (can a request ever fit), :mod:`~paged_edu.sched.swap` (the CPU
  swap space, lesson 6), :mod:`~paged_edu.sched.policy` (FCFS and SGLang's longest-prefix-first,
  lesson 8), :mod:`~paged_edu.sched.scheduler_output` (what one step schedules) and
  :mod:`~paged_edu.sched.parallel_sampling` (a request's ``n`` samples: one record, forked at the
  prompt's end, lesson 3).

It imports only :mod:`paged_edu.core`; the engine (:mod:`paged_edu.engine`) and the simulator
(:mod:`paged_edu.sim`) both drive it.
"""
