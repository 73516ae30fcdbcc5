"""Notebook glue, the top of the course (every lesson, 1-9): what a notebook's cells call directly.

* :mod:`~paged_edu.lessons.setup` -- the one call at the top of every lesson: device, dtype,
  Triton's interpreter, parameter checks, the Colab cell;
* :mod:`~paged_edu.lessons.prose` -- sentences rendered from the values a lesson computed (never typed);
* :mod:`~paged_edu.lessons.exercises` -- the "Your turn" exercises and their checks;
* :mod:`~paged_edu.lessons.my_allocator` -- exercise 5.3's allocator, written by the learner;
* :mod:`~paged_edu.lessons.where_it_lives` and :mod:`~paged_edu.lessons.past_one_gpu` -- lesson 8's
  tables of where each concept lives in vLLM and SGLang, with their cited sources.

The experiments the lessons run are in :mod:`paged_edu.labs`, the figures in :mod:`paged_edu.viz`.
"""
