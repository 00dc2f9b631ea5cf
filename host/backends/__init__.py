"""The backends the run loop drives: the contract (`base`), Triton's interpreter on the CPU
(`interpret`), an NVIDIA GPU through the driver (`cuda`).
"""
