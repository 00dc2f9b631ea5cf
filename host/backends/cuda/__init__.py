"""The cuda backend: the plan's launch lists on an NVIDIA GPU through the driver API, with its
collaborators (PTX loading, capture, timing, digests, teardown).
"""
