"""A Llama-family model that reads and writes the paged KV cache (lesson 5): the config and its
Hugging Face names, the layers and ``PagedLlama``, and loaders for random and real (SmolLM2) weights.
"""
