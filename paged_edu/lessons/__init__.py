"""What the notebooks call: set-up (device, dtype, Triton's interpreter, parameter checks),
experiments that run the library on real tensors, toy K/V, and the exercises with their checks.
"""
