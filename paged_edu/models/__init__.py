"""A Llama-family model that reads and writes the paged KV cache (lesson 5).

* :mod:`~paged_edu.models.config` -- ``LlamaConfig``, its Hugging Face names, its geometry, SmolLM2's config (no torch);
* :mod:`~paged_edu.models.llama` -- the layers and ``PagedLlama``, with ``ForwardBatch``, its input;
* :mod:`~paged_edu.models.loaders` -- random weights of a geometry, and the real SmolLM2-135M-Instruct.

The engine's runner (:mod:`paged_edu.engine.runner`) builds the batches; the model never imports it.
"""
